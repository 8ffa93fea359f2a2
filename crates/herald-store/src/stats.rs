//! Counters for the server's metrics, defined once in the table below
//! ([`herald_core::engine_counters!`]): the snapshot [`StoreStats`], the
//! live [`Counter`](herald_core::engine::Counter)s and the `/metrics` names
//! come from it. Monotonic since open, except `queue_depth` (a gauge).
//! Cheap enough to read on every scrape.

herald_core::engine_counters! {
    /// A snapshot of the engine's counters.
    pub struct StoreStats;
    pub(crate) struct Counters;
    counters {
        /// Durable messages appended to a log.
        appends => "appends": "Durable messages appended to the embedded log",
        /// Volatile messages fanned out (not stored).
        volatile,
        /// Appends answered from a stored receipt (nothing appended).
        dedup_hits,
        /// Appends refused: dedup key reused with a different request.
        dedup_mismatches,
        /// Group commits that carried at least one request.
        batches => "group_commits": "Group commits carrying at least one request",
        /// Requests carried by those group commits, every kind of write (an
        /// append batch counts each append; mean batch size =
        /// `batch_requests / batches`).
        batch_requests => "group_commit_requests": "Requests carried by group commits",
        /// Journal fsyncs (group commits that appended, with
        /// `FsyncMode::Always`; sweeps; the ack-sync timer; close).
        fsyncs => "fsyncs": "Journal fsyncs",
        /// Messages removed by `max_len` retention.
        trimmed => "trimmed": "Messages removed by max_len retention",
        /// Messages removed by `max_age` retention.
        expired => "expired": "Messages removed by max_age retention",
        /// Of the messages removed by retention (`trimmed` + `expired`), those
        /// above the lowest cursor of their channel: unacked by at least one
        /// subscriber. Counted once per message, not per subscriber; channels
        /// with more than 4096 cursors are not counted (see `cursors.rs`).
        unacked_trimmed,
        /// Acks that advanced a cursor (each one written).
        acks,
        /// Acks at or below the stored cursor: nothing written.
        acks_unchanged,
        /// Acks refused because their seq was beyond the channel's head.
        acks_beyond_head,
        /// Idempotency receipts removed after their TTL.
        receipts_expired => "receipts_expired": "Idempotency receipts removed after their TTL",
        /// Appends, room writes and presence joins refused because their
        /// channel was closed.
        closed_refused => "closed_refused": "Writes refused because the channel is closed",
        /// Presence joins, renews and leaves that changed a lease.
        presence_writes => "presence_writes": "Presence joins, renews and leaves that changed a lease",
        /// Leases removed by `presence_expire`.
        presence_expired,
        /// Room records written (each with its event).
        room_writes,
        /// Room writes refused by the version check.
        room_conflicts => "room_conflicts": "Room writes refused by the version check",
        /// Requests answered with `EngineError::Failed`.
        failed => "failed": "Requests failed by a storage error (fail-stop)",
    }
    gauges {
        /// Requests waiting in the writer's queue right now.
        queue_depth => "queue_depth": "Requests waiting for the writer",
    }
}

/// What one group commit counted, added to the [`Counters`] once it
/// committed (a failed batch counts only as failed).
pub(crate) type Tally = StoreStats;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exported_figures_are_the_documented_ones_in_order() {
        let live = Counters::default();
        live.add(&Tally { appends: 3, batches: 2, failed: 1, queue_depth: 99, ..Tally::default() });
        let stats = live.snapshot(7);
        assert_eq!((stats.appends, stats.batches, stats.failed, stats.queue_depth), (3, 2, 1, 7));
        let figures: Vec<_> = stats.metrics().into_iter().map(|m| (m.name, m.value, m.gauge)).collect();
        // docs/configuration.md, "Metrics".
        assert_eq!(
            figures,
            [
                ("appends", 3, false),
                ("group_commits", 2, false),
                ("group_commit_requests", 0, false),
                ("fsyncs", 0, false),
                ("trimmed", 0, false),
                ("expired", 0, false),
                ("receipts_expired", 0, false),
                ("closed_refused", 0, false),
                ("presence_writes", 0, false),
                ("room_conflicts", 0, false),
                ("failed", 1, false),
                ("queue_depth", 7, true),
            ]
        );
    }
}
