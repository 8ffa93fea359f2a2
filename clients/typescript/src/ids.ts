/** Random identifiers. `crypto.getRandomValues` works in every browser page
 * (also outside secure contexts, unlike `crypto.randomUUID`) and in Node 20. */

export function randomId(prefix: string): string {
  const bytes = new Uint8Array(16);
  globalThis.crypto.getRandomValues(bytes);
  let hex = '';
  for (const b of bytes) hex += b.toString(16).padStart(2, '0');
  return prefix + hex;
}

const CLIENT_ID_KEY = 'herald.client_id';

/**
 * The presence member id of this tab: kept in `sessionStorage` (one per
 * tab, kept across reloads) where there is one, else one per process.
 */
export function tabClientId(): string {
  let storage: Storage | undefined;
  try {
    storage = globalThis.sessionStorage;
  } catch {
    // Storage can be blocked (privacy settings, sandboxed iframes).
  }
  const existing = storage?.getItem(CLIENT_ID_KEY);
  if (existing) return existing;
  const id = randomId('tab-');
  try {
    storage?.setItem(CLIENT_ID_KEY, id);
  } catch {
    // Quota or blocked storage: the id lives as long as the page.
  }
  return id;
}
