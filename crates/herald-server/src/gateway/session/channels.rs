//! A connection's subscriptions and their delivery state ([`Channels`]):
//! per channel, its durable delivery (`herald_core::delivery`) and its
//! presence lease; the hub entries, released on every exit path
//! ([`Registrations`]); the redelivery timers of acked subscriptions; the
//! catch-up queue.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use herald_core::delivery::{self, Subscription};
use herald_core::{Seq, SubscriberId};
use herald_proto::ChannelName;
use tokio::time::Sleep;
use tokio_util::time::delay_queue::{DelayQueue, Key};

use super::subs;
use crate::metrics::Protocol;
use crate::rooms::MemberLease;
use crate::state::AppState;

pub(super) struct Sub {
    /// `None` for volatile channels.
    pub(super) log: Option<LogDelivery>,
    /// Presence channels: this connection's member lease. Boxed: most
    /// subscriptions have none.
    pub(super) presence: Option<Box<MemberLease>>,
}

pub(super) struct LogDelivery {
    pub(super) delivery: Subscription<Key>,
    /// Acked channels: whose cursor this is (token `sub` + device),
    /// validated once at subscribe. Boxed: most subscriptions have none.
    pub(super) subscriber: Option<Box<SubscriberId>>,
}

/// Redelivery timers of one connection, by (channel, seq), in one
/// tokio-util `DelayQueue` created on the first pending message and dropped
/// when none is left, so idle connections pay nothing for it. Boxed: an
/// inline `DelayQueue` would cost ~200 bytes per connection even unused.
/// Not persisted: on resume the subscription starts after the stored cursor
/// and timers are set again as messages go out.
pub(super) type Timers = Option<Box<DelayQueue<(ChannelName, Seq)>>>;

/// The connection's timer queue seen by one subscription's state machine.
pub(super) struct ChannelTimers<'a> {
    pub(super) queue: &'a mut Timers,
    pub(super) channel: &'a ChannelName,
}

impl delivery::Timers for ChannelTimers<'_> {
    type Key = Key;

    fn set(&mut self, seq: Seq, after: Duration) -> Key {
        self.queue
            .get_or_insert_with(|| Box::new(DelayQueue::new()))
            .insert((self.channel.clone(), seq), after)
    }

    fn cancel(&mut self, key: Key) {
        if let Some(q) = self.queue.as_mut() {
            q.try_remove(&key);
            if q.is_empty() {
                *self.queue = None;
            }
        }
    }
}

/// The connection's subscriptions and their hub entries. Dropping it
/// removes them all, so cleanup runs on every exit path of the task, panics
/// included.
pub(super) struct Registrations {
    pub(super) state: Arc<AppState>,
    pub(super) conn_id: u64,
    pub(super) subs: subs::SubMap<Sub>,
    /// The connection ended cleanly: leave presence at once on drop instead
    /// of letting the leases expire.
    pub(super) leave_on_drop: bool,
    /// The protocol, for its metrics.
    pub(super) protocol: Protocol,
}

impl Registrations {
    /// Returns the subscription, if the channel was subscribed.
    pub(super) fn remove(&mut self, channel: &ChannelName) -> Option<Sub> {
        let removed = self.subs.remove(channel);
        if removed.is_some() {
            self.release(channel.clone());
        }
        removed
    }

    /// Drop the hub entry of a subscription already taken out of `subs`, and
    /// balance its `watch` (the engine counts them).
    pub(super) fn release(&self, channel: ChannelName) {
        self.state.metrics.subscriptions.dec();
        self.state.hub.remove(&channel, self.conn_id);
        let engine = self.state.engine.clone();
        // The runtime may be gone at process exit; then there is nothing
        // left to unwatch.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { engine.unwatch(&channel).await });
        }
    }
}

impl Drop for Registrations {
    fn drop(&mut self) {
        let mut holds = Vec::new();
        for (channel, sub) in std::mem::take(&mut self.subs) {
            if let Some(hold) = sub.presence.filter(|_| self.leave_on_drop) {
                holds.push((channel.clone(), hold));
            }
            self.release(channel);
        }
        if !holds.is_empty() && tokio::runtime::Handle::try_current().is_ok() {
            // Tracked, so shutdown waits for these leaves before it closes
            // the engine.
            let state = self.state.clone();
            self.state.tasks.spawn(async move {
                for (channel, hold) in holds {
                    crate::rooms::leave(&state, &channel, &hold).await;
                }
            });
        }
        self.state.metrics.connections.dec();
        self.state.metrics.protocol_connection(self.protocol, -1);
    }
}

/// A connection's subscriptions and their delivery state: hub entries,
/// presence leases and each durable subscription's state machine
/// (`regs`), the redelivery timers of acked ones, and the queue of those
/// with catch-up work.
pub(super) struct Channels {
    pub(super) regs: Registrations,
    /// Redelivery timers of acked subscriptions.
    pub(super) timers: Timers,
    /// Subscriptions with catch-up work pending, served round-robin.
    pub(super) catchup: VecDeque<ChannelName>,
    /// Catch-up waits for room under the server's ceiling.
    pub(super) pause: Option<Pin<Box<Sleep>>>,
}
