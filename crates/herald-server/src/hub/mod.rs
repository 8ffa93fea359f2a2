//! The hub: which local connections subscribe to which channel, and the
//! engine's fan-out sink. Beside it, what fan-out works with: each
//! connection's [`Mailbox`] (`mailbox.rs`), the server-wide byte ceiling
//! ([`QueuedBytes`], `ceiling.rs`), and the registry of sessions with the
//! shedding of the largest holders at the ceiling (`sessions.rs`).
//!
//! Invariants:
//! - fan-out never awaits: each subscriber gets a `try_send` of the shared
//!   [`Outgoing`] (the message encoded once); a message a connection cannot
//!   take applies the channel's policy (durable: kick the connection as a
//!   slow consumer, it resumes from the log; volatile: drop for that
//!   connection and count);
//! - a connection takes a message only while its outbox holds fewer than
//!   `websocket.outbox_capacity` frames and, unless it holds nothing, at most
//!   `websocket.outbox_bytes` bytes (its [`Mailbox`]);
//! - the bytes queued server-wide ([`QueuedBytes`]: each frame once, however
//!   many outboxes share it) never exceed `websocket.total_outbox_bytes`: every
//!   charge is a compare-and-swap against the ceiling, released when the
//!   last holder lets go. A message that would cross it is queued for no one
//!   ([`Outgoing::missed`]), and the connections holding the most are
//!   kicked until the total is back under three quarters of the ceiling
//!   ([`Hub::shed`]);
//! - the hub holds only small handles (the connection's id and its
//!   [`Mailbox`]); the session task owns everything else and removes its entries
//!   on every exit path (see `gateway::session`'s `Registrations`).

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Instant;

use bytes::Bytes;
use herald_core::{FanoutSink, Message};
use herald_proto::ChannelName;

use crate::config::WebSocketConfig;
use crate::metrics::Metrics;

mod ceiling;
mod mailbox;
mod sessions;

pub use ceiling::{Charge, QueuedBytes};
pub use mailbox::{Closing, Mailbox, Order, PushError, Stop, ORDERS_MAX};
pub use sessions::{SessionInfo, Sessions};

const SHARDS: usize = 32;

/// What the hub knows about one connection.
#[derive(Clone)]
pub struct ConnHandle {
    pub id: u64,
    /// The connection's outbox, byte count and stop bits (see [`Mailbox`]).
    pub mailbox: Arc<Mailbox>,
}

/// One message on its way to this node's subscribers, shared by their
/// outboxes. Holds its frame's bytes against the server's ceiling until the
/// last outbox or write batch lets go of it.
pub struct Outgoing {
    pub msg: Arc<Message>,
    /// The server was at its ceiling: queued for no one. Carries the
    /// message without its frame; a durable subscriber that was keeping up
    /// reads it from the log instead (see `session::accept_live`).
    pub missed: bool,
    /// The message in the other encoded forms its subscribers' wires send,
    /// by [`Form`]: each made by the first subscriber that needs it and
    /// shared by the others (`None` inside: a frame that does not read).
    /// Not counted in the byte bounds: about the frame's size each, and
    /// only while the message is queued.
    forms: [OnceLock<Option<Bytes>>; FORMS],
    _charge: Option<Charge>,
}

/// How many encoded forms besides the stored frame a message can be
/// needed in on one node (see [`Outgoing::encoded`]).
pub const FORMS: usize = 3;

/// An encoded form of a live message other than its stored frame: an index
/// into [`Outgoing`]'s forms, claimed by a wire (`gateway::wire`). The hub
/// knows forms only by number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Form(usize);

impl Form {
    /// Form number `n`; at most [`FORMS`] exist (checked at compile time
    /// where the form is a constant).
    pub const fn new(n: usize) -> Self {
        assert!(n < FORMS, "more encoded forms than hub::FORMS");
        Form(n)
    }
}

impl Outgoing {
    /// The message in `form`, made by `encode` the first time it is asked
    /// for on this node and shared afterwards (a cheap `Bytes` clone).
    pub fn encoded(&self, form: Form, encode: impl FnOnce(&Message) -> Option<Bytes>) -> Option<Bytes> {
        self.forms[form.0].get_or_init(|| encode(&self.msg)).clone()
    }
}

/// One shard of the hub: a channel's local subscribers. Hashed with
/// foldhash, randomly seeded per process (channel names come from clients;
/// a seed they cannot know keeps them from choosing collisions), at a
/// fraction of SipHash's cost on the path of every delivery.
type Shard = RwLock<HashMap<ChannelName, Vec<ConnHandle>, foldhash::fast::RandomState>>;

pub struct Hub {
    shards: Vec<Shard>,
    metrics: Arc<Metrics>,
    /// The server-wide count (`websocket.total_outbox_bytes`).
    pub queued: Arc<QueuedBytes>,
    /// `websocket.outbox_bytes`.
    conn_bytes: usize,
    /// Time of the last shed, in ms since `born` (see [`Hub::shed`]).
    last_shed: AtomicU64,
    born: Instant,
}

impl Hub {
    pub fn new(metrics: Arc<Metrics>, websocket: &WebSocketConfig) -> Self {
        let queued = Arc::new(QueuedBytes::new(metrics.outbox_bytes.clone(), websocket.total_outbox_bytes));
        Self {
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::default())).collect(),
            metrics,
            queued,
            conn_bytes: websocket.outbox_bytes,
            last_shed: AtomicU64::new(0),
            born: Instant::now(),
        }
    }

    fn shard(&self, channel: &ChannelName) -> &Shard {
        use std::hash::BuildHasher;
        static HASHER: std::sync::OnceLock<foldhash::fast::RandomState> = std::sync::OnceLock::new();
        let h = HASHER.get_or_init(Default::default).hash_one(channel.as_str());
        &self.shards[(h as usize) % SHARDS]
    }

    /// Add a subscriber. Watching the channel is the engine's business: the
    /// session calls `Log::watch` for each subscription, and the engine
    /// counts them (`herald_core::feed::Watches`).
    pub fn add(&self, channel: &ChannelName, conn: ConnHandle) {
        let mut map = self.shard(channel).write().expect("hub lock poisoned");
        // Most channels have one subscriber (a user's own channel): room
        // for one, not the four a first push would reserve.
        map.entry(channel.clone()).or_insert_with(|| Vec::with_capacity(1)).push(conn);
    }

    /// Remove a subscriber (the session then calls `Log::unwatch`).
    pub fn remove(&self, channel: &ChannelName, conn_id: u64) {
        let mut map = self.shard(channel).write().expect("hub lock poisoned");
        let Some(subs) = map.get_mut(channel) else { return };
        subs.retain(|c| c.id != conn_id);
        if subs.is_empty() {
            map.remove(channel);
        }
    }

    /// Local subscribers of a channel (for tests and metrics).
    pub fn subscriber_count(&self, channel: &ChannelName) -> usize {
        self.shard(channel).read().expect("hub lock poisoned").get(channel).map_or(0, Vec::len)
    }

    /// Channels of `namespace` with a local subscriber (a reload that
    /// removes a namespace asks).
    pub fn channels_in(&self, namespace: &str) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.read().expect("hub lock poisoned").keys().filter(|c| c.namespace() == namespace).count()
            })
            .sum()
    }

    /// The channels each of `conns` subscribes on this node: one scan of
    /// every local subscription (the connection listing's cost).
    pub fn channels_of(&self, conns: &[u64]) -> HashMap<u64, Vec<ChannelName>> {
        let mut out: HashMap<u64, Vec<ChannelName>> = conns.iter().map(|&c| (c, Vec::new())).collect();
        for shard in &self.shards {
            let map = shard.read().expect("hub lock poisoned");
            for (channel, subs) in map.iter() {
                for conn in subs {
                    if let Some(list) = out.get_mut(&conn.id) {
                        list.push(channel.clone());
                    }
                }
            }
        }
        for list in out.values_mut() {
            list.sort();
        }
        out
    }

    /// Up to `limit` channels with a local subscriber, named after `after`
    /// and accepted by `filter`, in name order, with their local
    /// subscriber counts: one scan of every local channel.
    pub fn channels(
        &self,
        filter: impl Fn(&str) -> bool,
        after: Option<&str>,
        limit: usize,
    ) -> Vec<(ChannelName, usize)> {
        let mut out = Vec::new();
        for shard in &self.shards {
            let map = shard.read().expect("hub lock poisoned");
            for (channel, subs) in map.iter() {
                let name = channel.as_str();
                if after.is_none_or(|a| name > a) && filter(name) {
                    out.push((channel.clone(), subs.len()));
                }
            }
        }
        out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        out.truncate(limit);
        out
    }

    /// Local subscriptions, every channel's subscribers counted.
    pub fn subscriptions(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.read().expect("hub lock poisoned").values().map(Vec::len).sum::<usize>())
            .sum()
    }

    /// A connection cannot take `msg`: durable, kick it (the log has the
    /// message, the client resumes from its last seq); volatile, drop it.
    fn refuse(&self, conn: &ConnHandle, msg: &Message) {
        if msg.seq.is_some() {
            conn.mailbox.kick();
        } else {
            self.metrics.volatile_dropped.inc();
        }
    }

    /// At the server's ceiling the message is queued for no one: volatile,
    /// dropped; durable, the subscriber is sent a frameless copy, which
    /// makes it read the message from the log when there is room again (no
    /// disconnect). [`Hub::shed`] makes that room.
    fn at_ceiling(&self, conn: &ConnHandle, missed: &Arc<Outgoing>) {
        self.metrics.outbox_full_total.inc();
        if missed.msg.seq.is_none() {
            return self.refuse(conn, &missed.msg);
        }
        if let Err(PushError::Full) = conn.mailbox.push(missed.clone()) {
            self.metrics.outbox_full_frames.inc();
            self.refuse(conn, &missed.msg);
        }
    }
}

/// A copy of `msg` without its frame.
fn frameless(msg: &Message) -> Message {
    Message {
        channel: msg.channel.clone(),
        seq: msg.seq,
        id: msg.id.clone(),
        ts: msg.ts,
        epoch: msg.epoch.clone(),
        frame: Bytes::new(),
        closes: msg.closes,
    }
}

impl Hub {
    /// Charge one message against the server's ceiling (or mark it missed).
    fn outgoing(&self, msg: Arc<Message>) -> Arc<Outgoing> {
        Arc::new(match self.queued.try_charge(msg.frame.len()) {
            Some(charge) => Outgoing { msg, missed: false, forms: Default::default(), _charge: Some(charge) },
            None => Outgoing {
                msg: Arc::new(frameless(&msg)),
                missed: true,
                forms: Default::default(),
                _charge: None,
            },
        })
    }

    /// Queue one message for one connection, or apply the channel's policy
    /// when its outbox is full.
    fn offer(&self, conn: &ConnHandle, out: &Arc<Outgoing>) {
        if out.missed {
            return self.at_ceiling(conn, out);
        }
        let len = out.msg.frame.len();
        if !conn.mailbox.queued.try_add(len, self.conn_bytes) {
            self.metrics.outbox_full_bytes.inc();
            return self.refuse(conn, &out.msg);
        }
        match conn.mailbox.push(out.clone()) {
            Ok(()) => {}
            Err(PushError::Full) => {
                conn.mailbox.queued.sub(len);
                self.metrics.outbox_full_frames.inc();
                self.refuse(conn, &out.msg);
            }
            // The session is exiting; its cleanup removes this entry.
            Err(PushError::Closed) => conn.mailbox.queued.sub(len),
        }
    }

    /// Messages of one channel, in order, handed out connection by
    /// connection: each outbox gets the whole run in one go, so its session
    /// wakes once and writes them together (one flush).
    fn deliver_run(&self, run: &[Arc<Message>]) {
        let Some(first) = run.first() else { return };
        // One span per run: the fan-out of a group commit serves many
        // publishes at once, so it is no single publish's child.
        let _span = tracing::trace_span!(
            target: crate::trace::TARGET,
            "herald.fanout",
            channel = %first.channel,
            messages = run.len(),
            connections = tracing::field::Empty,
        )
        .entered();
        let map = self.shard(&first.channel).read().expect("hub lock poisoned");
        let Some(subs) = map.get(&first.channel) else { return };
        _span.record("connections", subs.len());
        // A run of one (each message of a batch to many channels) needs no
        // list of its own.
        let one;
        let many: Vec<Arc<Outgoing>>;
        let outs: &[Arc<Outgoing>] = if let [m] = run {
            one = [self.outgoing(m.clone())];
            &one
        } else {
            many = run.iter().map(|m| self.outgoing(m.clone())).collect();
            &many
        };
        for conn in subs {
            for out in outs {
                self.offer(conn, out);
            }
        }
        if outs.iter().any(|o| o.missed) {
            drop(map);
            self.shed();
        }
    }
}

impl FanoutSink for Hub {
    fn deliver(&self, msg: Arc<Message>) {
        self.deliver_run(std::slice::from_ref(&msg));
    }

    /// Per channel, runs of consecutive messages go out connection by
    /// connection (see `deliver_run`); each channel's order is kept.
    fn deliver_batch(&self, msgs: Vec<Arc<Message>>) {
        let mut rest = &msgs[..];
        while let Some(first) = rest.first() {
            let n = rest.iter().take_while(|m| m.channel == first.channel).count();
            self.deliver_run(&rest[..n]);
            rest = &rest[n..];
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use herald_core::Epoch;

    use super::*;

    pub(crate) fn outgoing(n: u64, queued: &Arc<QueuedBytes>) -> Arc<Outgoing> {
        let msg = Message {
            channel: ChannelName::new("live:t").unwrap(),
            seq: None,
            id: Arc::from(n.to_string()),
            ts: n,
            epoch: Epoch::new("e".to_owned()),
            frame: Bytes::from(vec![b'x'; 10]),
            closes: false,
        };
        let charge = queued.try_charge(10);
        Arc::new(Outgoing { msg: Arc::new(msg), missed: false, forms: Default::default(), _charge: charge })
    }
}
