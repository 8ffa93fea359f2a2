/** Reading a JWT's `exp` (not verifying it: that is the server's job), so
 * an expired token is replaced before connecting instead of after a refusal. */

/** Seconds since the Unix epoch at which `token` expires, if it says. */
export function tokenExpiry(token: string): number | undefined {
  const part = token.split('.')[1];
  if (!part) return undefined;
  try {
    const b64 = part.replace(/-/g, '+').replace(/_/g, '/');
    const text = atob(b64.padEnd(b64.length + ((4 - (b64.length % 4)) % 4), '='));
    const exp = (JSON.parse(text) as { exp?: unknown }).exp;
    return typeof exp === 'number' ? exp : undefined;
  } catch {
    return undefined;
  }
}

/** Whether `token` expires within `marginMs` from `now` (ms). */
export function expiresSoon(token: string, now: number, marginMs: number): boolean {
  const exp = tokenExpiry(token);
  return exp !== undefined && exp * 1000 <= now + marginMs;
}
