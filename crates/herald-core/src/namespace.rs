//! Namespaces: the part of a channel name before the first `:`, carrying the
//! channel's delivery options.

use std::collections::BTreeMap;
use std::time::Duration;

use herald_proto::ChannelName;
use serde::{Deserialize, Serialize};

use crate::engine::Retention;

/// How a namespace's messages are delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// No log, live only (typing, cursors, signals). No seq, no resume.
    Volatile,
    /// Logged; a client resumes with its last seq.
    Durable,
    /// Logged, with a server-held cursor per subscriber (acked delivery).
    Acked,
}

/// Options of one namespace. Every field has a default, so a config file may
/// name only what it changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NamespaceOptions {
    pub delivery: Delivery,
    /// Keep at most this many messages per channel (0 = unlimited).
    pub history_size: u64,
    /// Remove messages older than this (e.g. "72h"; "0s" = no age limit).
    #[serde(with = "humantime_serde")]
    pub history_ttl: Duration,
    /// Connected clients may publish (if their token allows the channel).
    pub client_publish: bool,
    /// API publishes without an `Idempotency-Key` are rejected.
    pub require_idempotency_key: bool,
    /// Subscribers are members (leases renewed by their connection), listed
    /// by presence requests; `join` and `leave` are pushed.
    pub presence: bool,
    /// Channels are rooms: created by `PUT /api/v1/rooms/{channel}`, with a
    /// host and the open → live → grace → closed lifecycle. Needs
    /// `presence` and a logged delivery.
    pub room: bool,
    /// Rooms: how long a room whose host left waits for the host before it
    /// closes (the default of `PUT`'s `grace_period`).
    #[serde(with = "humantime_serde")]
    pub grace_period: Duration,
    /// Acked: a delivered message not acked within this is sent again.
    #[serde(with = "humantime_serde")]
    pub ack_timeout: Duration,
    /// Acked: the longest wait between redeliveries (the backoff doubles up
    /// to this).
    #[serde(with = "humantime_serde")]
    pub ack_backoff_max: Duration,
    /// Acked: deliveries of one message on one connection, the first
    /// included; then the subscription is stale on that connection and the
    /// message waits in the inbox for the next resume.
    pub max_attempts: u32,
    /// Acked: most delivered-but-unacked messages per subscription; delivery
    /// pauses at this many and resumes as acks arrive.
    pub max_inflight: u32,
    /// Acked: where a subscriber with no cursor yet starts.
    pub new_subscriber_start: StartAt,
    /// User-limited channels: a channel whose name ends in `#` and a list
    /// of user ids (`dm:chat#42,43`) may be subscribed by those users only,
    /// whatever their token says, and by them with no token permission.
    pub allow_user_limited: bool,
}

/// Where a new acked subscriber (no cursor yet) starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartAt {
    /// At the oldest retained message: nothing retained is missed.
    Oldest,
    /// After the current head: only messages published from now on.
    Head,
}

impl Default for NamespaceOptions {
    fn default() -> Self {
        Self {
            delivery: Delivery::Durable,
            history_size: 10_000,
            history_ttl: Duration::from_secs(72 * 3600),
            client_publish: false,
            require_idempotency_key: false,
            presence: false,
            room: false,
            grace_period: Duration::from_secs(60),
            ack_timeout: Duration::from_secs(10),
            ack_backoff_max: Duration::from_secs(120),
            max_attempts: 5,
            max_inflight: 1000,
            new_subscriber_start: StartAt::Oldest,
            allow_user_limited: false,
        }
    }
}

impl NamespaceOptions {
    pub fn retention(&self) -> Retention {
        Retention {
            max_len: self.history_size,
            max_age: (!self.history_ttl.is_zero()).then_some(self.history_ttl),
        }
    }

    pub fn is_durable(&self) -> bool {
        self.delivery != Delivery::Volatile
    }
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("channel namespace `{0}` is not configured")]
pub struct UnknownNamespace(pub String);

/// The configured namespaces, by name. `""` is the namespace of channel names
/// without a `:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Namespaces(pub BTreeMap<String, NamespaceOptions>);

impl Default for Namespaces {
    /// `chat` (durable, clients publish), `user` (acked), `room` (durable,
    /// clients publish, presence and room lifecycle), `live` (volatile,
    /// clients publish).
    fn default() -> Self {
        let mut m = BTreeMap::new();
        m.insert("chat".into(), NamespaceOptions { client_publish: true, ..Default::default() });
        m.insert("user".into(), NamespaceOptions { delivery: Delivery::Acked, ..Default::default() });
        m.insert(
            "room".into(),
            NamespaceOptions { client_publish: true, presence: true, room: true, ..Default::default() },
        );
        m.insert(
            "live".into(),
            NamespaceOptions {
                delivery: Delivery::Volatile,
                history_size: 0,
                history_ttl: Duration::ZERO,
                client_publish: true,
                ..Default::default()
            },
        );
        Self(m)
    }
}

impl Namespaces {
    pub fn resolve(&self, channel: &ChannelName) -> Result<&NamespaceOptions, UnknownNamespace> {
        self.0.get(channel.namespace()).ok_or_else(|| UnknownNamespace(channel.namespace().to_owned()))
    }

    /// Check cross-field rules. Returns one message per problem.
    pub fn validate(&self) -> Result<(), String> {
        for (name, ns) in &self.0 {
            if !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'@' | b'='))
            {
                return Err(format!("namespace `{name}`: name may only use letters, digits and _-.@="));
            }
            if ns.delivery == Delivery::Acked {
                if ns.ack_timeout.is_zero() || ns.ack_backoff_max < ns.ack_timeout {
                    return Err(format!(
                        "namespace `{name}`: ack_timeout must be positive and ack_backoff_max at least ack_timeout"
                    ));
                }
                if ns.max_attempts == 0 || ns.max_inflight == 0 {
                    return Err(format!(
                        "namespace `{name}`: max_attempts and max_inflight must be at least 1"
                    ));
                }
            }
            if ns.room && (ns.delivery == Delivery::Volatile || !ns.presence) {
                return Err(format!(
                    "namespace `{name}`: room needs presence = true and a durable or acked delivery"
                ));
            }
            if ns.room && ns.grace_period.is_zero() {
                return Err(format!("namespace `{name}`: grace_period must be positive"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_have_the_four_documented_namespaces() {
        let ns = Namespaces::default();
        let chat = ns.resolve(&ChannelName::new("chat:1").unwrap()).unwrap();
        assert!(chat.client_publish && chat.is_durable());
        let live = ns.resolve(&ChannelName::new("live:x").unwrap()).unwrap();
        assert_eq!(live.delivery, Delivery::Volatile);
        assert!(ns.resolve(&ChannelName::new("user:42").unwrap()).is_ok());
        assert!(ns.resolve(&ChannelName::new("room:abc").unwrap()).is_ok());
        assert_eq!(ns.resolve(&ChannelName::new("nope:1").unwrap()), Err(UnknownNamespace("nope".into())));
        ns.validate().unwrap();
    }

    #[test]
    fn parses_from_toml_with_partial_fields() {
        let ns: Namespaces = toml::from_str(
            r#"
            [orders]
            history_ttl = "24h"
            require_idempotency_key = true
            "#,
        )
        .unwrap();
        let o = &ns.0["orders"];
        assert_eq!(o.history_ttl, Duration::from_secs(86400));
        assert_eq!(o.retention().max_age, Some(Duration::from_secs(86400)));
        let unlimited: Namespaces = toml::from_str("[x]\nhistory_ttl = \"0s\"").unwrap();
        assert_eq!(unlimited.0["x"].retention().max_age, None);
        assert!(o.require_idempotency_key);
        assert_eq!(o.history_size, 10_000);
        let bad: Result<Namespaces, _> = toml::from_str("[x]\ndelivery = \"sometimes\"");
        assert!(bad.is_err());
    }

    #[test]
    fn rooms_need_presence_and_a_log() {
        let room =
            |extra: &str| -> Namespaces { toml::from_str(&format!("[r]\nroom = true\n{extra}")).unwrap() };
        assert!(room("").validate().is_err(), "room without presence");
        assert!(room("presence = true").validate().is_ok());
        assert!(room("presence = true\ndelivery = \"volatile\"").validate().is_err());
        assert!(room("presence = true\ngrace_period = \"0s\"").validate().is_err());
        let defaults = Namespaces::default();
        let r = defaults.resolve(&ChannelName::new("room:a").unwrap()).unwrap();
        assert!(r.room && r.presence && r.grace_period == Duration::from_secs(60));
    }
}
