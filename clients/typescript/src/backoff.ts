/** Reconnect delays: exponential backoff with full jitter. */

export interface BackoffOptions {
  /** Ceiling of the first delay, ms. Default 250. */
  baseMs?: number;
  /** Largest ceiling, ms. Default 10,000. */
  maxMs?: number;
}

/**
 * The ceiling for attempt `n` (0-based): `min(max, base * 2^n)`. The
 * delay is uniform in `[0, ceiling]` (full jitter), which spreads a crowd
 * of clients that lost the same server over the whole window instead of
 * bringing them back in synchronised waves.
 */
export function backoffCeiling(attempt: number, opts: Required<BackoffOptions>): number {
  const exp = Math.min(Math.max(attempt, 0), 30);
  return Math.min(opts.maxMs, opts.baseMs * 2 ** exp);
}

export function backoffDelay(
  attempt: number,
  opts: Required<BackoffOptions>,
  random: () => number = Math.random,
): number {
  return Math.floor(random() * (backoffCeiling(attempt, opts) + 1));
}
