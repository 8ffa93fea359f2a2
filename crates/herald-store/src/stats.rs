//! Counters for the server's metrics. Monotonic since open, except
//! `queue_depth` (a gauge). Cheap enough to read on every scrape.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of the engine's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Durable messages appended to a log.
    pub appends: u64,
    /// Volatile messages fanned out (not stored).
    pub volatile: u64,
    /// Appends answered from a stored receipt (nothing appended).
    pub dedup_hits: u64,
    /// Appends refused: dedup key reused with a different request.
    pub dedup_mismatches: u64,
    /// Group commits that carried at least one request.
    pub batches: u64,
    /// Requests (appends and acks) carried by those group commits (mean
    /// batch size = `batch_requests / batches`).
    pub batch_requests: u64,
    /// Journal fsyncs (group commits that appended, with
    /// `FsyncMode::Always`; sweeps; the ack-sync timer; close).
    pub fsyncs: u64,
    /// Messages removed by `max_len` retention.
    pub trimmed: u64,
    /// Messages removed by `max_age` retention.
    pub expired: u64,
    /// Of the messages removed by retention (`trimmed` + `expired`), those
    /// above the lowest cursor of their channel: unacked by at least one
    /// subscriber. Counted once per message, not per subscriber; channels
    /// with more than 4096 cursors are not counted (see `cursors.rs`).
    pub unacked_trimmed: u64,
    /// Acks that advanced a cursor (each one written).
    pub acks: u64,
    /// Acks at or below the stored cursor: nothing written.
    pub acks_unchanged: u64,
    /// Acks refused because their seq was beyond the channel's head.
    pub acks_beyond_head: u64,
    /// Idempotency receipts removed after their TTL.
    pub receipts_expired: u64,
    /// Appends, room writes and presence joins refused because their
    /// channel was sealed.
    pub closed_refused: u64,
    /// Presence joins, renews and leaves that changed a lease.
    pub presence_writes: u64,
    /// Leases removed by `presence_expire`.
    pub presence_expired: u64,
    /// Room records written (each with its event).
    pub room_writes: u64,
    /// Room writes refused by the version check.
    pub room_conflicts: u64,
    /// Requests answered with `EngineError::Failed`.
    pub failed: u64,
    /// Requests waiting in the writer's queue right now.
    pub queue_depth: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub appends: AtomicU64,
    pub volatile: AtomicU64,
    pub dedup_hits: AtomicU64,
    pub dedup_mismatches: AtomicU64,
    pub batches: AtomicU64,
    pub batch_requests: AtomicU64,
    pub fsyncs: AtomicU64,
    pub trimmed: AtomicU64,
    pub expired: AtomicU64,
    pub unacked_trimmed: AtomicU64,
    pub acks: AtomicU64,
    pub acks_unchanged: AtomicU64,
    pub acks_beyond_head: AtomicU64,
    pub receipts_expired: AtomicU64,
    pub closed_refused: AtomicU64,
    pub presence_writes: AtomicU64,
    pub presence_expired: AtomicU64,
    pub room_writes: AtomicU64,
    pub room_conflicts: AtomicU64,
    pub failed: AtomicU64,
}

/// Relaxed: counters are independent and read for reporting only.
pub(crate) fn bump(c: &AtomicU64, n: u64) {
    if n > 0 {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

impl Counters {
    pub fn snapshot(&self, queue_depth: u64) -> StoreStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StoreStats {
            appends: get(&self.appends),
            volatile: get(&self.volatile),
            dedup_hits: get(&self.dedup_hits),
            dedup_mismatches: get(&self.dedup_mismatches),
            batches: get(&self.batches),
            batch_requests: get(&self.batch_requests),
            fsyncs: get(&self.fsyncs),
            trimmed: get(&self.trimmed),
            expired: get(&self.expired),
            unacked_trimmed: get(&self.unacked_trimmed),
            acks: get(&self.acks),
            acks_unchanged: get(&self.acks_unchanged),
            acks_beyond_head: get(&self.acks_beyond_head),
            receipts_expired: get(&self.receipts_expired),
            closed_refused: get(&self.closed_refused),
            presence_writes: get(&self.presence_writes),
            presence_expired: get(&self.presence_expired),
            room_writes: get(&self.room_writes),
            room_conflicts: get(&self.room_conflicts),
            failed: get(&self.failed),
            queue_depth,
        }
    }
}
