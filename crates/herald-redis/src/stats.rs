//! Counters for the server's metrics, defined once in the table below
//! ([`herald_core::engine_counters!`]): the snapshot [`RedisStats`], the
//! live [`Counter`](herald_core::engine::Counter)s and the `/metrics` names
//! come from it. Monotonic since open; cheap enough to read on every
//! scrape.

herald_core::engine_counters! {
    /// A snapshot of the engine's counters.
    pub struct RedisStats;
    pub(crate) struct Counters;
    counters {
        /// Durable messages appended through this node.
        appends => "appends": "Durable messages appended through this node",
        /// Volatile messages broadcast through this node.
        volatile,
        /// Appends answered from a stored receipt.
        dedup_hits,
        /// Appends refused: dedup key reused with a different request.
        dedup_mismatches,
        /// Calls failed with `Unavailable` (Redis down, slow or refusing).
        unavailable => "unavailable": "Calls failed because Redis was down, slow or refusing",
        /// Acks that advanced a cursor.
        acks,
        /// Fan-out messages received over pub/sub and handed to the sink.
        fanout_delivered => "fanout_delivered": "Pub/sub messages handed to this node's subscribers",
        /// Messages handed to the sink from the log, to fill a gap in the
        /// pub/sub stream (a dropped connection, a full queue, a missed message).
        fanout_filled => "fanout_filled": "Messages read from the log to fill a pub/sub gap",
        /// Gap fills started (a seq jump, a head check finding more, a resubscribe).
        fanout_gaps => "fanout_gaps": "Gap fills started (seq jump, head check, resubscribe)",
        /// Disconnections of the pub/sub connection.
        pubsub_disconnects => "pubsub_disconnects": "Disconnections of the pub/sub connection",
        /// Pub/sub messages dropped because the fan-out queue was full (its
        /// count or its bytes): durable ones are then read from the log,
        /// volatile ones are lost.
        fanout_queue_full => "fanout_queue_full": "Pub/sub messages dropped for a full fan-out queue (durable ones then read from the log)",
        /// Redis lost data that this node can tell (a channel's meta missing
        /// while its log exists, a log behind or different from what was
        /// already delivered): a new epoch was started.
        data_loss_detected => "data_loss_detected": "Redis data losses detected (a new epoch was started)",
        /// Epoch changes of watched channels seen by this node (its own and
        /// other nodes').
        epoch_changes => "epoch_changes": "Epoch changes of watched channels seen by this node",
        /// Times the node's lease was found lost and registered again.
        lease_reregistrations => "lease_reregistrations": "Times this node's lease was lost and registered again",
        /// Appends, joins and room writes refused because the channel is closed.
        closed_refused => "closed_refused": "Writes refused because the channel is closed",
        /// Expired leases removed by this node's sweeps.
        presence_expired,
        /// Room records written (with their event) through this node.
        room_writes,
        /// Room writes refused by the version check.
        room_conflicts => "room_conflicts": "Room writes refused by the version check",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exported_figures_are_the_documented_ones_in_order() {
        let live = Counters::default();
        live.fanout_gaps.bump();
        live.fanout_filled.add(5);
        let figures: Vec<_> =
            live.snapshot().metrics().into_iter().map(|m| (m.name, m.value, m.gauge)).collect();
        // docs/configuration.md, "Metrics".
        assert_eq!(
            figures,
            [
                ("appends", 0, false),
                ("unavailable", 0, false),
                ("fanout_delivered", 0, false),
                ("fanout_filled", 5, false),
                ("fanout_gaps", 1, false),
                ("pubsub_disconnects", 0, false),
                ("fanout_queue_full", 0, false),
                ("data_loss_detected", 0, false),
                ("epoch_changes", 0, false),
                ("lease_reregistrations", 0, false),
                ("closed_refused", 0, false),
                ("room_conflicts", 0, false),
            ]
        );
    }
}
