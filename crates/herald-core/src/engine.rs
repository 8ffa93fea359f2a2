//! The storage and fan-out contract.
//!
//! Every engine must provide, for each channel:
//! - **gap-free seqs**: the n-th durable append to a channel gets seq n
//!   (within one epoch); a seq is never reused or skipped;
//! - **atomic dedup**: the idempotency check, the append and the storing of
//!   the receipt are one step, so concurrent appends with the same key append
//!   once;
//! - **durable before success**: `append` returns `Ok` only once the message
//!   (and its dedup receipt) is as durable as the engine's documented
//!   setting promises;
//! - **ordered fan-out**: every successful append is handed to the
//!   [`FanoutSink`] of every node watching the channel, per channel in seq
//!   order, after it is durable. A transport may drop fan-out messages (Redis
//!   pub/sub can); receivers detect the gap by seq and fill it with
//!   [`Engine::read`], so a dropped fan-out never loses a message.
//!
//! The shape maps onto Redis one to one: append is one Lua script (dedup
//! check, INCR, XADD, trim, receipt), read is XRANGE, position is GET + XINFO,
//! fan-out is (S)PUBLISH with `watch` as (S)SUBSCRIBE.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use herald_proto::{ChannelName, Meta};
use serde_json::value::RawValue;

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
    /// The complete `{"type":"message",...}` frame, shared by every
    /// subscriber.
    pub frame: Bytes,
}

/// Where a channel's log stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    pub epoch: Epoch,
    /// Oldest retained seq; `head + 1` when the log is empty.
    pub first: Seq,
    /// Last assigned seq; 0 before the first append.
    pub head: Seq,
}

/// The result of a range read.
#[derive(Debug)]
pub struct Page {
    /// The log's position when the page was read.
    pub position: Position,
    /// Messages with `seq > after` (and `>= first`), ascending, gap-free.
    pub messages: Vec<Arc<Message>>,
}

/// Engine readiness, for `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Ready,
    /// Temporarily unable to serve (for example Redis unreachable).
    Unavailable(String),
    /// Fail-stop after a storage error: refuses writes until restarted.
    Failed(String),
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum EngineError {
    /// The dedup key was used before with a different fingerprint.
    #[error("idempotency key was used with a different request")]
    IdempotencyMismatch,
    /// Transient: retry later (the server answers 503 with Retry-After).
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// Fail-stop: a storage I/O error happened; the engine refuses writes.
    #[error("storage failed: {0}")]
    Failed(String),
    /// The engine is closing.
    #[error("storage is shutting down")]
    ShuttingDown,
}

/// Receives every appended message of the channels this node watches.
///
/// Called from the engine's fan-out path: implementations must not block or
/// await (use `try_send`), and per channel calls come in seq order.
pub trait FanoutSink: Send + Sync + 'static {
    fn deliver(&self, msg: Arc<Message>);
}

#[async_trait]
pub trait Engine: Send + Sync + 'static {
    /// Install the node's fan-out receiver. Called once, before any append.
    fn set_sink(&self, sink: Arc<dyn FanoutSink>);

    /// Append with dedup, atomically. See the module docs for the contract.
    async fn append(&self, req: AppendRequest) -> Result<Receipt, EngineError>;

    /// The channel's epoch, first and head. A channel never written has
    /// `head = 0, first = 1`.
    async fn position(&self, channel: &ChannelName) -> Result<Position, EngineError>;

    /// Up to `limit` messages with `seq > after`, ascending. If `after + 1`
    /// was trimmed, the page starts at `first` (the caller compares with
    /// `position.first` to report truncation).
    async fn read(&self, channel: &ChannelName, after: Seq, limit: usize) -> Result<Page, EngineError>;

    /// This node has local subscribers for `channel` (Redis: SSUBSCRIBE).
    async fn watch(&self, _channel: &ChannelName) -> Result<(), EngineError> {
        Ok(())
    }

    /// This node has no more local subscribers for `channel`.
    async fn unwatch(&self, _channel: &ChannelName) {}

    fn health(&self) -> Health;

    /// Flush and stop. Appends after this fail with `ShuttingDown`.
    async fn close(&self);
}
