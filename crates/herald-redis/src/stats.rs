//! Counters for the server's metrics. Monotonic since open; relaxed
//! atomics, cheap enough to read on every scrape.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of the engine's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RedisStats {
    /// Durable messages appended through this node.
    pub appends: u64,
    /// Volatile messages broadcast through this node.
    pub volatile: u64,
    /// Appends answered from a stored receipt.
    pub dedup_hits: u64,
    /// Appends refused: dedup key reused with a different request.
    pub dedup_mismatches: u64,
    /// Calls failed with `Unavailable` (Redis down, slow or refusing).
    pub unavailable: u64,
    /// Acks that advanced a cursor.
    pub acks: u64,
    /// Fan-out messages received over pub/sub and handed to the sink.
    pub fanout_delivered: u64,
    /// Messages handed to the sink from the log, to fill a gap in the
    /// pub/sub stream (a dropped connection, a full queue, a missed message).
    pub fanout_filled: u64,
    /// Gap fills started (a seq jump, a head check finding more, a resubscribe).
    pub fanout_gaps: u64,
    /// Disconnections of the pub/sub connection.
    pub pubsub_disconnects: u64,
    /// Pub/sub messages dropped because the fan-out queue was full (filled
    /// from the log).
    pub fanout_queue_full: u64,
    /// Redis lost data that this node can tell (a channel's meta missing
    /// while its log exists, a log behind or different from what was
    /// already delivered): a new epoch was started.
    pub data_loss_detected: u64,
    /// Epoch changes of watched channels seen by this node (its own and
    /// other nodes').
    pub epoch_changes: u64,
    /// Times the node's lease was found lost and registered again.
    pub lease_reregistrations: u64,
    /// Appends, joins and room writes refused because the channel is sealed.
    pub closed_refused: u64,
    /// Expired leases removed by this node's sweeps.
    pub presence_expired: u64,
    /// Room records written (with their event) through this node.
    pub room_writes: u64,
    /// Room writes refused by the version check.
    pub room_conflicts: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub appends: AtomicU64,
    pub volatile: AtomicU64,
    pub dedup_hits: AtomicU64,
    pub dedup_mismatches: AtomicU64,
    pub unavailable: AtomicU64,
    pub acks: AtomicU64,
    pub fanout_delivered: AtomicU64,
    pub fanout_filled: AtomicU64,
    pub fanout_gaps: AtomicU64,
    pub pubsub_disconnects: AtomicU64,
    pub fanout_queue_full: AtomicU64,
    pub data_loss_detected: AtomicU64,
    pub epoch_changes: AtomicU64,
    pub lease_reregistrations: AtomicU64,
    pub closed_refused: AtomicU64,
    pub presence_expired: AtomicU64,
    pub room_writes: AtomicU64,
    pub room_conflicts: AtomicU64,
}

pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn add(c: &AtomicU64, n: u64) {
    if n > 0 {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

impl Counters {
    pub fn snapshot(&self) -> RedisStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RedisStats {
            appends: get(&self.appends),
            volatile: get(&self.volatile),
            dedup_hits: get(&self.dedup_hits),
            dedup_mismatches: get(&self.dedup_mismatches),
            unavailable: get(&self.unavailable),
            acks: get(&self.acks),
            fanout_delivered: get(&self.fanout_delivered),
            fanout_filled: get(&self.fanout_filled),
            fanout_gaps: get(&self.fanout_gaps),
            pubsub_disconnects: get(&self.pubsub_disconnects),
            fanout_queue_full: get(&self.fanout_queue_full),
            data_loss_detected: get(&self.data_loss_detected),
            epoch_changes: get(&self.epoch_changes),
            lease_reregistrations: get(&self.lease_reregistrations),
            closed_refused: get(&self.closed_refused),
            presence_expired: get(&self.presence_expired),
            room_writes: get(&self.room_writes),
            room_conflicts: get(&self.room_conflicts),
        }
    }
}
