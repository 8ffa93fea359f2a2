//! The log: appends with dedup, positions, range reads, and the fan-out of
//! every append to the nodes that watch its channel.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use herald_proto::{ChannelName, FrameKind, Meta};
use serde_json::value::RawValue;

use super::EngineError;

/// Position of a message in its channel: 1, 2, 3, ...
pub type Seq = u64;

/// One incarnation of a channel's log. If a log is lost or reset, its epoch
/// changes and clients resuming with the old epoch resync.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Epoch(pub Arc<str>);

impl Epoch {
    pub fn new(s: impl Into<Arc<str>>) -> Self {
        Self(s.into())
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Retention of a channel's log, applied at append (length) and by the
/// engine's sweeper (age).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Keep at most this many messages; 0 = no length limit.
    pub max_len: u64,
    /// Remove messages older than this; `None` = no age limit.
    pub max_age: Option<Duration>,
}

/// The idempotency part of an append.
#[derive(Clone)]
pub struct Dedup {
    /// Opaque, already scoped (per credential) and hashed by the caller. Never
    /// logged.
    pub key: Arc<str>,
    /// Hash of the whole request; a hit with a different fingerprint is
    /// [`EngineError::IdempotencyMismatch`].
    pub fingerprint: [u8; 32],
    /// How long the receipt is kept.
    pub ttl: Duration,
}

impl fmt::Debug for Dedup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dedup").field("key", &"<redacted>").field("ttl", &self.ttl).finish()
    }
}

/// A request to append (durable) or broadcast (volatile) one message.
#[derive(Debug)]
pub struct AppendRequest {
    pub channel: ChannelName,
    /// Raw JSON, stored and forwarded byte for byte.
    pub data: Box<RawValue>,
    pub meta: Option<Meta>,
    /// `false` for volatile namespaces: no log, no seq, live fan-out only
    /// (dedup, if asked for, still applies).
    pub durable: bool,
    pub retention: Retention,
    pub dedup: Option<Dedup>,
    /// The frame's type (`message` for everything apps publish). The engine
    /// encodes the frame with [`herald_proto::encode_frame`].
    pub kind: FrameKind,
    /// Durable only: this is the channel's last message. The channel is
    /// closed for good in the same atomic step ([`Position::closed`]); any
    /// later append fails with [`EngineError::Closed`].
    pub closes: bool,
}

impl AppendRequest {
    /// An app message with no dedup: the common case, for tests and tools.
    pub fn message(channel: ChannelName, data: Box<RawValue>, durable: bool, retention: Retention) -> Self {
        AppendRequest {
            channel,
            data,
            meta: None,
            durable,
            retention,
            dedup: None,
            kind: FrameKind::Message,
            closes: false,
        }
    }
}

/// The result of an append: what the publisher is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    pub channel: ChannelName,
    /// `None` for volatile messages.
    pub seq: Option<Seq>,
    /// Globally unique, time-ordered (UUIDv7).
    pub id: Arc<str>,
    pub epoch: Epoch,
    /// Server time of the original append, ms since the Unix epoch.
    pub ts: u64,
    /// `true` when the dedup key matched an earlier append; nothing was
    /// appended this time and the fields are the original ones.
    pub duplicate: bool,
}

/// A stored (or broadcast) message, with its wire frame encoded once.
#[derive(Debug)]
pub struct Message {
    pub channel: ChannelName,
    /// `None` for volatile messages.
    pub seq: Option<Seq>,
    pub id: Arc<str>,
    pub ts: u64,
    pub epoch: Epoch,
    /// The complete `{"type":"message",...}` frame (or another
    /// [`FrameKind`]), shared by every subscriber.
    pub frame: Bytes,
    /// The channel's final message ([`AppendRequest::closes`]): after it a
    /// subscriber is unsubscribed. Engines set it on fan-out and on reads.
    pub closes: bool,
}

impl Message {
    /// The seq of an [epoch marker](Message::epoch_marker). No message has
    /// it (seqs start at 1).
    pub const MARKER_SEQ: Seq = 0;

    /// A fan-out signal, not a message: `channel`'s log is now in `epoch`
    /// (the engine lost data and started a new one). It carries no frame
    /// and is never sent to a client; a subscriber still on another epoch
    /// reads the log, which sends its client to resync, at once instead of
    /// at the channel's next message. Its seq is [`Message::MARKER_SEQ`],
    /// below every real seq, so a subscriber already in `epoch` ignores it
    /// as a duplicate.
    pub fn epoch_marker(channel: ChannelName, epoch: Epoch) -> Self {
        Message {
            channel,
            seq: Some(Self::MARKER_SEQ),
            id: Arc::from(""),
            ts: 0,
            epoch,
            frame: Bytes::new(),
            closes: false,
        }
    }

    /// Whether this is an [epoch marker](Message::epoch_marker).
    pub fn is_epoch_marker(&self) -> bool {
        self.seq == Some(Self::MARKER_SEQ)
    }
}

/// Where a channel's log stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    pub epoch: Epoch,
    /// Oldest retained seq; `head + 1` when the log is empty.
    pub first: Seq,
    /// Last assigned seq; 0 before the first append.
    pub head: Seq,
    /// The channel was closed: `head` is its final message and no append
    /// will follow.
    pub closed: bool,
}

/// The result of a range read.
#[derive(Debug)]
pub struct Page {
    /// The log's position when the page was read.
    pub position: Position,
    /// Messages with `seq > after` (and `>= first`), ascending, gap-free.
    pub messages: Vec<Arc<Message>>,
}

/// Receives every appended message of the channels this node watches.
///
/// Called from the engine's fan-out path: implementations must not block or
/// await (use `try_send`), and per channel calls come in seq order within
/// an epoch. An engine that sees a watched channel's epoch change hands the
/// sink an [epoch marker](Message::epoch_marker) as soon as it knows, so
/// subscribers of a quiet channel learn of the loss without waiting for its
/// next message.
pub trait FanoutSink: Send + Sync + 'static {
    fn deliver(&self, msg: Arc<Message>);

    /// Several messages at once (a group commit's), in order: the same as
    /// [`deliver`](FanoutSink::deliver) of each in turn, as far as any one
    /// channel's order goes. A sink may hand them out subscriber by
    /// subscriber, so each subscriber's queue gets the batch in one go.
    fn deliver_batch(&self, msgs: Vec<Arc<Message>>) {
        for msg in msgs {
            self.deliver(msg);
        }
    }
}

/// A channel's log and its fan-out: the part of the contract a delivery
/// path needs (see the [module docs](super) for the promises: gap-free
/// seqs, atomic dedup, durable before `Ok`, ordered fan-out).
#[async_trait]
pub trait Log: Send + Sync + 'static {
    /// Install the node's fan-out receiver. Called once, before any append.
    fn set_sink(&self, sink: Arc<dyn FanoutSink>);

    /// Append with dedup, atomically. See the module docs for the contract.
    async fn append(&self, req: AppendRequest) -> Result<Receipt, EngineError>;

    /// Append several requests as one submission, in the order given: each
    /// gets its own result, in that order, exactly as if they had been
    /// [`append`](Log::append)ed one after the other (a refusal of one does
    /// not affect the others; a storage failure fails it and, with the
    /// engine in fail-stop, those after it). Per channel, the messages of a
    /// batch are ordered as in the batch. An engine that
    /// can hand the whole batch to its storage at once (one queue hand-off,
    /// one group commit) overrides this; the default appends one by one.
    async fn append_batch(&self, reqs: Vec<AppendRequest>) -> Vec<Result<Receipt, EngineError>> {
        let mut out = Vec::with_capacity(reqs.len());
        for req in reqs {
            out.push(self.append(req).await);
        }
        out
    }

    /// The channel's epoch, first and head. A channel never written has
    /// `head = 0, first = 1`.
    async fn position(&self, channel: &ChannelName) -> Result<Position, EngineError>;

    /// Up to `limit` messages with `seq > after`, ascending. If `after + 1`
    /// was trimmed, the page starts at `first` (the caller compares with
    /// `position.first` to report truncation).
    async fn read(&self, channel: &ChannelName, after: Seq, limit: usize) -> Result<Page, EngineError>;

    /// A local subscriber of `channel` arrived (Redis: SSUBSCRIBE for the
    /// first one). Called once per local subscription, before its position
    /// is read; each call is balanced by one [`unwatch`](Log::unwatch),
    /// also when it failed. An engine whose fan-out needs per-channel
    /// subscriptions counts them (with [`crate::feed::Watches`], the one
    /// place watches are counted): the channel stays watched while more
    /// `watch` than `unwatch` calls were made, whatever order concurrent
    /// calls run in (an `unwatch` for a subscriber that left may run after
    /// the `watch` for one that came).
    async fn watch(&self, _channel: &ChannelName) -> Result<(), EngineError> {
        Ok(())
    }

    /// A local subscriber of `channel` went (see [`watch`](Log::watch)).
    async fn unwatch(&self, _channel: &ChannelName) {}
}
