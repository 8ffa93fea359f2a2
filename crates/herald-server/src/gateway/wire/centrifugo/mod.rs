//! Centrifugo's client protocol v2 (docs/centrifugo.md), so the centrifuge
//! SDKs connect to Herald unchanged: the JSON wire (here: one command per
//! line of a text frame, pings as `{}`), the Protobuf wire
//! (`protobuf.rs`), the connection's protocol state shared by both
//! ([`Conn`]), and the upgrade of `/connection/websocket`, which picks the
//! wire (`upgrade.rs`).
//! The commands are applied by the session (`session/centrifugo.rs`) with
//! the same handlers as Herald's frames.

use std::time::{Duration, Instant};

use bytes::Bytes;
use herald_core::Message;
use herald_proto::centrifugo::{self as cf, Answer, Empty, Reply};
use herald_proto::ChannelName;
use tokio_websockets::Message as WsMessage;

use super::{Command, Commands};
use crate::error::ApiError;

pub(crate) mod protobuf;
pub(crate) mod upgrade;

/// A Centrifugo connection's protocol state.
pub struct Conn {
    /// Set by `connect`; before it only `connect` is accepted.
    pub connected: bool,
    /// The connection's client id (`client` of the connect reply; its
    /// presence client id).
    pub client: String,
    /// Dev mode: the `?user=` of the upgrade, for a connect without token.
    pub dev_user: Option<String>,
    /// The upgrade's `?device=`.
    pub device: Option<String>,
    /// The upgrade's headers, kept until `connect` when a connect proxy
    /// is configured (it decides for a connect without token).
    pub headers: Option<Box<http::HeaderMap>>,
    /// The payload of the last `{}` ping sent; the client's `{}` echoes it
    /// (presence rejoins wait for one).
    pub ping: Option<Bytes>,
    /// `connect` or `refresh` changed the identity (its expiry).
    pub identity_changed: bool,
    /// When the socket opened: `connect` must come within
    /// `heartbeat.idle_timeout`.
    opened: Instant,
}

impl Conn {
    /// The state of a new connection.
    pub fn new(
        dev_user: Option<String>,
        device: Option<String>,
        headers: Option<Box<http::HeaderMap>>,
    ) -> Self {
        Conn {
            connected: false,
            client: crate::gateway::session::new_client_id(),
            dev_user,
            device,
            headers,
            ping: None,
            identity_changed: false,
            opened: Instant::now(),
        }
    }

    /// The heartbeat's ping: the wire's own ping frame (`wire_ping`) once
    /// connected, whose answer (a pong command) stands for `payload`'s echo;
    /// before, a WebSocket ping, within the deadline for `connect`.
    pub(super) fn ping(
        &mut self,
        payload: Bytes,
        idle_timeout: Duration,
        wire_ping: fn() -> WsMessage,
    ) -> Result<WsMessage, &'static str> {
        if self.connected {
            self.ping = Some(payload);
            return Ok(wire_ping());
        }
        if self.opened.elapsed() >= idle_timeout {
            return Err("no connect command in time");
        }
        Ok(WsMessage::ping(payload))
    }
}

/// The commands of a JSON text frame, one per non-empty line; a line that
/// does not parse, or a binary frame, is refused (the connection closes).
pub struct Lines<'a>(Option<std::str::Split<'a, char>>);

impl Iterator for Lines<'_> {
    type Item = Command;

    fn next(&mut self) -> Option<Command> {
        let lines = self.0.as_mut()?;
        let line = lines.map(str::trim).find(|l| !l.is_empty())?;
        Some(match cf::Command::parse(line) {
            Ok(cmd) => Command::Centrifugo { id: cmd.id, method: cmd.method() },
            Err(_) => {
                self.0 = None;
                Command::Refuse { reply: None, reason: "malformed command" }
            }
        })
    }
}

pub(super) fn decode_json(msg: &WsMessage) -> Commands<'_> {
    match msg.as_text() {
        Some(text) => Commands::Lines(Lines(Some(text.split('\n')))),
        None => Commands::One(Some(Command::Refuse { reply: None, reason: "binary frame" })),
    }
}

/// The JSON wire's ping: `{}`.
pub(super) fn ping_json() -> WsMessage {
    WsMessage::text(Bytes::from_static(cf::PING))
}

/// A message or presence frame as a JSON push; `None` (logged) for a
/// stored frame that does not read.
pub(super) fn push_json(msg: &Message) -> Option<Bytes> {
    let push = cf::push_of_frame(msg.channel.as_str(), &msg.frame);
    if push.is_none() {
        tracing::error!(channel = %msg.channel, seq = ?msg.seq, "frame unreadable; not sent");
    }
    push.map(Bytes::from)
}

/// The push that says the server ended a subscription.
pub(super) fn unsubscribed<'a>(channel: &'a ChannelName, reason: &str) -> cf::Push<'a> {
    cf::Push {
        unsubscribe: Some(cf::Unsubscribe { code: cf::unsubscribe_code::SERVER, reason: reason.to_owned() }),
        ..cf::Push::new(channel.as_str())
    }
}

/// The push that says the server subscribed the connection, starting
/// after `ok`'s position (its `since`, or the head).
pub(super) fn subscribed<'a>(
    channel: &'a ChannelName,
    ok: &herald_proto::OkFrame,
    start: u64,
) -> cf::Push<'a> {
    let durable = ok.epoch.is_some();
    cf::Push {
        subscribe: Some(cf::SubscribePush {
            recoverable: durable,
            epoch: ok.epoch.clone().unwrap_or_default(),
            offset: start,
            positioned: durable,
        }),
        ..cf::Push::new(channel.as_str())
    }
}

/// An error reply to request `req`.
pub(super) fn error(err: &ApiError, req: Option<u64>) -> Reply<'static> {
    Reply::error(command_id(req), err.code, err.detail.clone())
}

/// The reply to a publish that the engine took.
pub(super) fn published(req: Option<u64>) -> Reply<'static> {
    Reply::new(command_id(req), Answer::Publish(Empty {}))
}

/// Request ids: Herald's `req` carries Centrifugo's command `id`.
fn command_id(req: Option<u64>) -> u32 {
    req.and_then(|r| u32::try_from(r).ok()).unwrap_or(0)
}
