/**
 * Per-subscription resume position and dedup: pure logic, no IO (the
 * TypeScript twin of `crates/herald-client/src/resume.rs`, extended for
 * acked channels).
 *
 * Invariants, within one epoch:
 * - `handled <= received`;
 * - every seq `<= received` was accepted for delivery (queued, being
 *   handled, or handled), so a seq at or below it is a duplicate;
 * - every seq `<= handled` was handled by the application (or skipped by a
 *   reported reset); on acked channels nothing above `handled` is acked.
 * Resume point: `received` on durable channels (what is queued is kept),
 * `handled` on acked ones (what was not handled must come again, so the
 * client drops its queue and the server resends from there).
 */

/** The fields of a subscribe `ok` reply the cursor acts on. */
export interface SubscribeReply {
  epoch?: string;
  first?: number;
  head?: number;
  truncated?: boolean;
  epoch_changed?: boolean;
  /** Acked channels only: the stored cursor. */
  cursor?: number;
  /** Acked channels only: how many messages the server will deliver. */
  unread?: number;
}

export interface Reset {
  truncated: boolean;
  epochChanged: boolean;
}

export type Verdict = { kind: 'deliver' } | { kind: 'duplicate' } | { kind: 'gap'; expected: number };

export interface Since {
  seq: number;
  epoch?: string;
}

export class Cursor {
  received: number | undefined;
  handled: number | undefined;
  epoch: string | undefined;
  /** The channel is acked (the `ok` reply carried a `cursor`). */
  acked = false;

  constructor(since?: Since) {
    if (since) {
      this.received = this.handled = since.seq;
      this.epoch = since.epoch || undefined;
    }
  }

  /** The `since` to send with a (re)subscribe. */
  since(): Since | undefined {
    const seq = this.acked ? this.handled : this.received;
    if (seq === undefined) return undefined;
    return this.epoch === undefined ? { seq } : { seq, epoch: this.epoch };
  }

  /**
   * A new connection (or a resubscribe) is about to subscribe again. On
   * acked channels the queue is dropped and the server resends from
   * `handled`; `inProgress` (the seq the application is handling now)
   * stays a duplicate so it is not handed over twice.
   */
  onResubscribe(inProgress: number | undefined): void {
    if (this.acked) this.received = Math.max(this.handled ?? 0, inProgress ?? 0);
  }

  /**
   * Apply a subscribe reply. Returns the discontinuity the application
   * must hear about. On an epoch change the caller drops its queue too.
   */
  onSubscribed(r: SubscribeReply): Reset {
    if (r.epoch === undefined) {
      // Volatile: no log, no seqs.
      this.received = this.handled = this.epoch = undefined;
      return { truncated: false, epochChanged: false };
    }
    const epochChanged = !!r.epoch_changed || (this.epoch !== undefined && this.epoch !== r.epoch);
    const truncated = !!r.truncated;
    const first = r.first ?? 1;
    const head = r.head ?? 0;
    this.epoch = r.epoch;
    if (r.cursor !== undefined) {
      // The server starts after max(since, stored cursor), or where the
      // namespace says for a new subscriber: exactly `head - unread`.
      this.acked = true;
      const start = head - (r.unread ?? 0);
      this.handled = start;
      this.received = epochChanged ? start : Math.max(start, this.received ?? 0);
    } else if (epochChanged) {
      this.received = this.handled = first - 1;
    } else if (truncated) {
      this.received = first - 1;
    } else if (this.received === undefined) {
      // Live from now: resuming from `head` later loses nothing.
      this.received = this.handled = head;
    }
    return { truncated, epochChanged };
  }

  /** Judge an arriving message by its seq; advances `received` when accepted. */
  onMessage(seq: number | undefined): Verdict {
    if (seq === undefined) return { kind: 'deliver' };
    const pos = this.received;
    if (pos !== undefined && seq <= pos) return { kind: 'duplicate' };
    this.received = seq;
    if (pos === undefined || seq === pos + 1) return { kind: 'deliver' };
    return { kind: 'gap', expected: pos + 1 };
  }

  /** The application handled `seq` (and, cumulatively, everything before it). */
  onHandled(seq: number): void {
    if (this.handled === undefined || seq > this.handled) this.handled = seq;
    if (this.received === undefined || this.handled > this.received) this.received = this.handled;
  }

  /** The handler failed: everything after `handled` must be accepted again. */
  onFailed(): void {
    this.received = this.handled;
  }
}
