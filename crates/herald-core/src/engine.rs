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
//!   [`Engine::read`], so a dropped fan-out never loses a message;
//! - **monotonic cursors**: a subscriber's cursor on a channel (the highest
//!   seq it acknowledged) only moves forward and never past the channel's
//!   head (within one epoch: an engine that loses a log drops or resets its
//!   cursors with it), and an `ack` that returned `Ok` is visible to every later `cursor`,
//!   `cursors` and `user_cursors` call (see [`Engine::ack`] for durability).
//!
//! The shape maps onto Redis one to one: append is one Lua script (dedup
//! check, INCR, XADD, trim, receipt), read is XRANGE, position is GET + XINFO,
//! fan-out is (S)PUBLISH with `watch` as (S)SUBSCRIBE. Cursors are a hash per
//! channel (`{channel}:cursors`, field = [`SubscriberId::key`]) changed by a
//! compare-and-raise script, plus a set per user indexing its cursors
//! (another hash slot, so written before the cursor, and entries without a
//! cursor skipped when listing).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use herald_proto::{ChannelName, FrameKind, Meta};
use serde_json::value::RawValue;

use crate::presence::{FenceToken, Joined, Lease, Member, Rejoined, Renewed};
use crate::room::Room;

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
    pub seal: bool,
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
            seal: false,
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
    /// The channel's final message ([`AppendRequest::seal`]): after it a
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
    /// The channel was sealed: `head` is its final message and no append
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

/// Who acknowledges messages on acked channels: a token's `sub` plus the
/// optional device id given at connect. Each device of a user has its own
/// cursor; `device: None` is a subscriber of its own, distinct from every
/// device of the same user.
///
/// Both parts are ids by the one rule of [`herald_proto::check_id`]
/// (1..=[`SubscriberId::MAX_PART_LEN`] bytes of UTF-8 without control
/// characters, so `\0` can separate a subscriber from what follows it in a
/// storage key). An empty device counts as no device.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubscriberId {
    user: Arc<str>,
    device: Option<Arc<str>>,
}

/// Why a user or device id is not acceptable as a [`SubscriberId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidSubscriber {
    #[error("subscriber user id must not be empty")]
    EmptyUser,
    #[error("subscriber {0} id is longer than 255 bytes")]
    TooLong(&'static str),
    #[error("subscriber {0} id contains a control character")]
    ControlChar(&'static str),
    #[error("malformed subscriber key")]
    MalformedKey,
}

impl SubscriberId {
    /// Longest user id and longest device id, in bytes.
    pub const MAX_PART_LEN: usize = herald_proto::MAX_ID_LEN;

    pub fn new(user: impl Into<Arc<str>>, device: Option<Arc<str>>) -> Result<Self, InvalidSubscriber> {
        let user = user.into();
        if user.is_empty() {
            return Err(InvalidSubscriber::EmptyUser);
        }
        check_part(&user, "user")?;
        let device = device.filter(|d| !d.is_empty());
        if let Some(d) = &device {
            check_part(d, "device")?;
        }
        Ok(Self { user, device })
    }

    pub fn user(&self) -> &str {
        &self.user
    }

    pub fn device(&self) -> Option<&str> {
        self.device.as_deref()
    }

    /// The device id, shared.
    pub fn device_arc(&self) -> Option<&Arc<str>> {
        self.device.as_ref()
    }

    /// The stable storage form: `{len(user)}:{user}` followed, with a device,
    /// by `{len(device)}:{device}` (lengths in bytes, decimal). Length
    /// prefixes make it unambiguous whatever the ids contain, and every key
    /// of a user starts with [`SubscriberId::user_prefix`] while no key of
    /// another user does, so "all devices of a user" is a prefix scan.
    /// Never contains a control character. Changing it orphans stored
    /// cursors: it is part of every engine's storage format.
    pub fn key(&self) -> String {
        let mut k = Self::user_prefix_unchecked(&self.user);
        if let Some(d) = &self.device {
            k.push_str(&d.len().to_string());
            k.push(':');
            k.push_str(d);
        }
        k
    }

    /// The prefix shared by the [`key`](SubscriberId::key) of every
    /// subscriber of `user` (with and without device), and by no other.
    /// `None` when `user` is not a valid user id (it can have no cursors).
    pub fn user_prefix(user: &str) -> Option<String> {
        if user.is_empty() || check_part(user, "user").is_err() {
            return None;
        }
        Some(Self::user_prefix_unchecked(user))
    }

    fn user_prefix_unchecked(user: &str) -> String {
        format!("{}:{user}", user.len())
    }

    /// Parse a [`key`](SubscriberId::key); rejects anything `key` would not
    /// produce (leading zeros, trailing bytes, invalid parts).
    pub fn parse_key(key: &str) -> Result<Self, InvalidSubscriber> {
        let (user, rest) = take_part(key)?;
        let device = if rest.is_empty() {
            None
        } else {
            let (device, rest) = take_part(rest)?;
            if !rest.is_empty() {
                return Err(InvalidSubscriber::MalformedKey);
            }
            Some(Arc::from(device))
        };
        Self::new(user, device)
    }
}

/// A non-empty part, by the shared id rule.
fn check_part(s: &str, what: &'static str) -> Result<(), InvalidSubscriber> {
    match herald_proto::check_id(s) {
        Ok(()) => Ok(()),
        Err(herald_proto::IdError::Empty) => Err(InvalidSubscriber::EmptyUser),
        Err(herald_proto::IdError::TooLong) => Err(InvalidSubscriber::TooLong(what)),
        Err(herald_proto::IdError::ControlChar) => Err(InvalidSubscriber::ControlChar(what)),
    }
}

/// Split `{len}:{part}` off the front of `s`.
fn take_part(s: &str) -> Result<(&str, &str), InvalidSubscriber> {
    let (len, rest) = s.split_once(':').ok_or(InvalidSubscriber::MalformedKey)?;
    let canonical = !len.is_empty() && len.len() <= 3 && len.bytes().all(|b| b.is_ascii_digit());
    if !canonical || (len.len() > 1 && len.starts_with('0')) {
        return Err(InvalidSubscriber::MalformedKey);
    }
    let len: usize = len.parse().map_err(|_| InvalidSubscriber::MalformedKey)?;
    // Parts are never empty (`new` drops an empty device, rejects an empty
    // user), so a zero length is not canonical either.
    if len == 0 || len > rest.len() || !rest.is_char_boundary(len) {
        return Err(InvalidSubscriber::MalformedKey);
    }
    Ok(rest.split_at(len))
}

impl fmt::Debug for SubscriberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.device {
            Some(d) => write!(f, "{:?}/{:?}", &*self.user, &**d),
            None => write!(f, "{:?}", &*self.user),
        }
    }
}

/// A subscriber's cursor on one channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CursorState {
    /// The highest seq acknowledged: every seq `<= seq` counts as delivered.
    pub seq: Seq,
    /// When the cursor last advanced (server time, ms since the Unix epoch).
    /// An ack that does not advance the cursor leaves it unchanged.
    pub acked_at_ms: u64,
}

/// One of a user's cursors, as listed by [`Engine::user_cursors`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserCursor {
    pub channel: ChannelName,
    pub device: Option<Arc<str>>,
    pub cursor: CursorState,
}

/// Why an [`Engine::ack`] was refused.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum AckError {
    /// `seq` is past the channel's head: it acknowledges messages that do
    /// not exist (yet), so nothing was stored. The server answers the client
    /// with an error frame; it is never retried.
    #[error("ack of seq {seq} is beyond the channel head {head}")]
    BeyondHead { seq: Seq, head: Seq },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// One of an engine's own figures, exported by the server on `/metrics` as
/// `herald_engine_{name}` (counters get `_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineMetric {
    /// snake_case, without prefix or `_total`.
    pub name: &'static str,
    pub help: &'static str,
    pub value: u64,
    /// A gauge (a level, like a queue depth) rather than a counter.
    pub gauge: bool,
}

impl EngineMetric {
    pub const fn counter(name: &'static str, help: &'static str, value: u64) -> Self {
        Self { name, help, value, gauge: false }
    }

    pub const fn gauge(name: &'static str, help: &'static str, value: u64) -> Self {
        Self { name, help, value, gauge: true }
    }
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
    /// The channel was sealed (a closed room): nothing more is appended.
    #[error("the channel is closed")]
    Closed,
}

/// The result of [`Engine::room_write`].
#[derive(Debug)]
pub enum RoomWritten {
    /// The record is now `room`, and its event was appended with `receipt`.
    Written { room: Room, receipt: Receipt },
    /// Nothing was written: the stored version is not the expected one (or
    /// the room exists on create, or is missing on update). `current` is the
    /// stored record.
    Conflict { current: Option<Room> },
}

/// A compare-and-set of a room's record plus its event.
#[derive(Debug)]
pub struct RoomWrite {
    /// The version the record must have now; `None` = create (the room must
    /// not exist).
    pub expected_version: Option<u64>,
    /// The new record; its `version` is `expected_version + 1` (1 on create).
    pub room: Room,
    /// The room event: durable, on the room's channel, `kind` [`FrameKind::Room`],
    /// `seal` set exactly when `room.state` is closed.
    pub event: AppendRequest,
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

    /// Acknowledge every seq `<= seq` of `channel` for `subscriber`: the
    /// stored cursor becomes `max(stored, seq)` and the resulting cursor is
    /// returned. Cumulative, monotonic (a lower or equal `seq` changes
    /// nothing, not even `acked_at_ms`) and idempotent. `seq = 0` is valid:
    /// it creates a cursor at 0 if there is none.
    ///
    /// `seq` above the channel's head is refused with
    /// [`AckError::BeyondHead`] and nothing is stored: clamping it to the
    /// head would acknowledge messages the subscriber never received.
    ///
    /// Durability: an ack costs no fsync of its own. When `Ok` is returned
    /// the cursor has reached the engine's store as far as the engine's
    /// documented ack setting promises (at least: it survives a crash of
    /// the Herald process). An ack lost to a machine crash only causes
    /// redelivery, never loss. Concurrent acks of one cursor are applied in
    /// some order; the result is their maximum.
    async fn ack(
        &self,
        channel: &ChannelName,
        subscriber: &SubscriberId,
        seq: Seq,
    ) -> Result<CursorState, AckError>;

    /// The subscriber's cursor on `channel`; `None` before its first ack.
    async fn cursor(
        &self,
        channel: &ChannelName,
        subscriber: &SubscriberId,
    ) -> Result<Option<CursorState>, EngineError>;

    /// Up to `limit` cursors of `channel` (delivery receipts), one per
    /// subscriber, in an engine-defined order.
    async fn cursors(
        &self,
        channel: &ChannelName,
        limit: usize,
    ) -> Result<Vec<(SubscriberId, CursorState)>, EngineError>;

    /// Up to `limit` cursors of `user`, across its devices and channels (the
    /// user's inbox), in an engine-defined order. Cursors of other users are
    /// never listed, whatever their names share with `user`. A `user` that
    /// is not a valid [`SubscriberId`] user has none.
    async fn user_cursors(&self, user: &str, limit: usize) -> Result<Vec<UserCursor>, EngineError>;

    // ---- Presence (see `presence.rs` for the invariants) ----

    /// Make `member` present on `channel` until now + `ttl`, with a new
    /// fencing token. A stored lease with the same key (expired or not, as
    /// long as no sweep removed it) is taken over: [`Joined::Reclaimed`].
    /// A sealed channel (a closed room) takes no members:
    /// [`EngineError::Closed`].
    ///
    /// Durability of presence writes (join, renew, leave, expire): like an
    /// ack — no fsync of their own; `Ok` survives a crash of the Herald
    /// process.
    async fn presence_join(
        &self,
        channel: &ChannelName,
        member: &Member,
        ttl: Duration,
    ) -> Result<Joined, EngineError>;

    /// Extend the lease `key` to now + `ttl` if its token is `token`. Never
    /// creates a lease; a lease that expired but was not swept yet is
    /// extended (no `leave` was announced for it, so the member never left).
    async fn presence_renew(
        &self,
        channel: &ChannelName,
        key: &str,
        token: FenceToken,
        ttl: Duration,
    ) -> Result<Renewed, EngineError>;

    /// Remove the lease `key` if its token is `token`; returns it when
    /// removed (the caller announces the `leave`). Either way the holder of
    /// `token` is done: a later [`presence_rejoin`](Engine::presence_rejoin)
    /// with `token` is [`Rejoined::Fenced`] (a clean close removes whatever
    /// lease of its token exists, including one a rejoin re-created, and no
    /// rejoin still in flight can bring it back).
    async fn presence_leave(
        &self,
        channel: &ChannelName,
        key: &str,
        token: FenceToken,
    ) -> Result<Option<Lease>, EngineError>;

    /// Bring back the lease of `member` that its holder held with `token`,
    /// after a renew found it [`Renewed::Gone`] (it expired and was swept
    /// while the holder could not renew) and the holder showed it is alive.
    /// The rejoin carries the fencing token, so a late one loses; in one
    /// atomic step:
    /// - the lease is stored with `token`: extended, [`Rejoined::Held`];
    /// - the lease is stored with another token (a later join): nothing
    ///   changes, [`Rejoined::Fenced`] (a rejoin never takes a member over);
    /// - no lease, and the engine remembers the member's last removal
    ///   ([`GONE_MEMORY`](crate::GONE_MEMORY)) as a leave with `token`, or
    ///   as the removal of a greater token: [`Rejoined::Fenced`];
    /// - otherwise the lease is created again with `token` (not a new one:
    ///   a leave with `token` still removes it) until now + `ttl`,
    ///   [`Rejoined::Back`]: announce a `join`.
    ///
    /// A sealed channel (a closed room): [`EngineError::Closed`].
    async fn presence_rejoin(
        &self,
        channel: &ChannelName,
        member: &Member,
        token: FenceToken,
        ttl: Duration,
    ) -> Result<Rejoined, EngineError>;

    /// Up to `limit` unexpired leases of `channel`, ordered by key.
    async fn presence(&self, channel: &ChannelName, limit: usize) -> Result<Vec<Lease>, EngineError>;

    /// How many unexpired leases `channel` has.
    async fn presence_count(&self, channel: &ChannelName) -> Result<u64, EngineError>;

    /// Whether `user` holds an unexpired lease on `channel` (any client id).
    async fn presence_has_user(&self, channel: &ChannelName, user: &str) -> Result<bool, EngineError>;

    /// Remove up to `limit` leases (of any channel) that expired, and return
    /// them. Each removal is remembered (see
    /// [`presence_rejoin`](Engine::presence_rejoin)): its holder may ask for
    /// it back. Each removed lease is returned to at most one caller, on any
    /// node, which announces its `leave`: exactly one unless the reply is
    /// lost (the caller gave up, a Redis reply timed out), in which case the
    /// lease is gone without a `leave` frame — presence listings stay right,
    /// only the live event is missing.
    async fn presence_expire(&self, limit: usize) -> Result<Vec<(ChannelName, Lease)>, EngineError>;

    // ---- Rooms (see `room.rs`) ----

    /// The room record of `channel`, if it was created.
    async fn room(&self, channel: &ChannelName) -> Result<Option<Room>, EngineError>;

    /// Compare-and-set the room record on `write.expected_version` and
    /// append `write.event` to the room's channel, as one atomic step: both
    /// happen or neither. When the new state is closed the same step seals
    /// the channel, removes every lease of it (no `leave` is announced: the
    /// final event says it all) and takes the room out of
    /// [`rooms_active`](Engine::rooms_active). A write to a room whose
    /// channel is already sealed is [`EngineError::Closed`].
    async fn room_write(&self, write: RoomWrite) -> Result<RoomWritten, EngineError>;

    /// Up to `limit` rooms that are not closed, with channel names greater
    /// than `after`, in name order (for the keeper that drives timers).
    async fn rooms_active(
        &self,
        after: Option<&ChannelName>,
        limit: usize,
    ) -> Result<Vec<(ChannelName, Room)>, EngineError>;

    fn health(&self) -> Health;

    /// The engine's own counters and gauges, read on every `/metrics`
    /// scrape (cheap: relaxed atomics).
    fn metrics(&self) -> Vec<EngineMetric> {
        Vec::new()
    }

    /// Flush and stop. Appends after this fail with `ShuttingDown`.
    async fn close(&self);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(user: &str, device: Option<&str>) -> SubscriberId {
        SubscriberId::new(user, device.map(Arc::from)).expect("valid subscriber")
    }

    #[test]
    fn subscriber_keys_round_trip_and_are_unambiguous() {
        let cases = [
            sub("u", None),
            sub("u", Some("a")),
            sub("u:1", Some("2:x")),
            sub("12:ab", None),
            sub("hé llo/☃", Some("phone 1")),
            sub(&"x".repeat(255), Some(&"y".repeat(255))),
        ];
        let keys: Vec<String> = cases.iter().map(SubscriberId::key).collect();
        assert_eq!(keys[0], "1:u");
        assert_eq!(keys[1], "1:u1:a");
        for (id, key) in cases.iter().zip(&keys) {
            assert_eq!(&SubscriberId::parse_key(key).expect("parses"), id);
            assert!(!key.chars().any(char::is_control));
        }
        let mut unique = keys.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), keys.len(), "distinct subscribers, distinct keys");
    }

    #[test]
    fn user_prefix_matches_exactly_that_users_keys() {
        let prefix = SubscriberId::user_prefix("u").expect("valid user");
        for (id, mine) in [
            (sub("u", None), true),
            (sub("u", Some("1:u")), true),
            (sub("u1", None), false),
            (sub("1:u", None), false),
            (sub("uu", Some("a")), false),
        ] {
            assert_eq!(id.key().starts_with(&prefix), mine, "{id:?}");
        }
        assert_eq!(SubscriberId::user_prefix(""), None);
        assert_eq!(SubscriberId::user_prefix("a\nb"), None);
    }

    #[test]
    fn invalid_ids_and_keys_are_rejected() {
        assert_eq!(SubscriberId::new("", None), Err(InvalidSubscriber::EmptyUser));
        assert_eq!(SubscriberId::new("a\0b", None), Err(InvalidSubscriber::ControlChar("user")));
        assert_eq!(
            SubscriberId::new("a", Some("x\ty".into())),
            Err(InvalidSubscriber::ControlChar("device"))
        );
        assert_eq!(SubscriberId::new("x".repeat(256), None), Err(InvalidSubscriber::TooLong("user")));
        assert_eq!(sub("u", Some("")), sub("u", None), "an empty device is no device");
        for bad in ["", "u", "1:", "0:", "01:u", "2:u", "1:ua", "1:u0:", "1:u1:a1:b", "-1:u", "1:u1:"] {
            assert!(SubscriberId::parse_key(bad).is_err(), "{bad:?}");
        }
        // A multi-byte char cut by the length.
        assert!(SubscriberId::parse_key("1:é").is_err());
    }
}
