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
//!   [`Log::read`], so a dropped fan-out never loses a message;
//! - **monotonic cursors**: a subscriber's cursor on a channel (the highest
//!   seq it acknowledged) only moves forward and never past the channel's
//!   head (within one epoch: an engine that loses a log drops or resets its
//!   cursors with it), and an `ack` that returned `Ok` is visible to every later `cursor`,
//!   `cursors` and `user_cursors` call (see [`Cursors::ack`] for durability).
//!
//! The shape maps onto Redis one to one: append is one Lua script (dedup
//! check, INCR, XADD, trim, receipt), read is XRANGE, position is GET + XINFO,
//! fan-out is (S)PUBLISH with `watch` as (S)SUBSCRIBE. Cursors are a hash per
//! channel (`{channel}:cursors`, field = [`SubscriberId::key`]) changed by a
//! compare-and-raise script, plus a set per user indexing its cursors
//! (another hash slot, so written before the cursor, and entries without a
//! cursor skipped when listing).
//!
//! # The parts
//!
//! The contract is split by concern, so an engine, a test double or a new
//! engine implements what it needs, and code that needs one part asks for
//! that part only:
//! - [`Log`] (`log.rs`): append, position, read, watch and unwatch, the
//!   [`FanoutSink`], and the log's types (seqs, epochs, messages, pages);
//! - [`Cursors`] (`cursors.rs`): ack, cursor, cursors, user cursors;
//! - [`Presence`] (`presence.rs`): leases with fencing tokens;
//! - [`Rooms`] (`rooms.rs`): room records, compare-and-set with their event;
//! - [`Schedules`] (`schedules.rs`): scheduled messages, claimed with
//!   fencing tokens and appended exactly once;
//! - [`Lifecycle`] (`lifecycle.rs`): health, metrics, close;
//! - [`Ownership`] (`ownership.rs`): exclusive leases with fencing tokens on
//!   work one node at a time must do (webhook delivery of a channel);
//! - [`Control`] (`control.rs`): bans and revocations of users (stored:
//!   they hold on every node and across restarts), the control channel
//!   every node listens to (at most once per node), and the registry of
//!   nodes (leased entries).
//!
//! [`Engine`] is the eight together, implemented for every type that
//! implements them; the server holds an `Arc<dyn Engine>`. [`EngineError`]
//! is in `error.rs`, [`EngineMetric`] and the counter table
//! ([`engine_counters!`](crate::engine_counters)) in `metrics.rs`. Subscriber
//! ids, the key every engine stores cursors under, are defined here.
//!
//! # Who guarantees what on the fan-out path
//!
//! - The engine: per watched channel, the sink gets messages in seq order
//!   within an epoch, after they are durable, and an epoch marker when it
//!   sees the epoch change. An engine whose transport can lose messages
//!   also fills the gaps from its log, with a [`Feed`](crate::feed::Feed)
//!   per channel, so the sink gets every seq once (a range removed by
//!   retention excepted) and a loss on a quiet channel is found by a head
//!   check rather than by the next message.
//! - Each subscription ([`delivery::Subscription`](crate::delivery::Subscription)):
//!   every seq goes to its client once, in order, with no gap. It relies on
//!   the order alone: a gap, or another epoch, sends it back to the log.
//!   The engine's gap filling is what keeps that rare and cheap (one read
//!   per node and gap, not one per subscriber).

mod control;
mod cursors;
mod error;
mod lifecycle;
mod log;
mod metrics;
mod ownership;
mod presence;
mod rooms;
mod schedules;

pub use control::{Admission, Ban, Control, ControlSink, NodeView};
pub use cursors::{AckError, CursorAck, CursorState, Cursors, UserCursor};
pub use error::EngineError;
pub use lifecycle::{Health, Lifecycle};
pub use log::{
    AppendRequest, Dedup, Epoch, FanoutSink, Log, Message, Page, Position, Receipt, Retention, Seq,
};
pub use metrics::{Counter, EngineMetric};
pub use ownership::{Owned, Ownership};
pub use presence::{LeaseJoin, LeaseLeave, LeaseRejoin, LeaseRenew, Presence};
pub use rooms::{RoomWrite, RoomWritten, Rooms};
pub use schedules::{Claim, Delivered, Schedule, ScheduleReceipt, ScheduleRequest, Schedules};

use std::fmt;
use std::sync::Arc;

/// A whole engine: every part of the contract. Implemented for every type
/// that implements the parts; write `impl Log for MyEngine`, and so on.
pub trait Engine: Log + Cursors + Presence + Rooms + Schedules + Lifecycle + Ownership + Control {}

impl<T: Log + Cursors + Presence + Rooms + Schedules + Lifecycle + Ownership + Control + ?Sized> Engine
    for T
{
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
