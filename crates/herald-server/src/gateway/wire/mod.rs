//! The wires a session speaks: how one connection's commands are decoded
//! from the frames it reads, and how its replies, pushes, pings and close
//! reasons are encoded on the socket. One module per wire:
//!
//! - `herald.rs`: Herald's JSON protocol (`/ws`, docs/protocol.md);
//! - `centrifugo/`: Centrifugo's client protocol v2, JSON and Protobuf
//!   (`/connection/websocket`, docs/centrifugo.md), with its upgrade.
//!
//! The session (`gateway::session`) keeps every delivery state and never
//! asks which wire it speaks: it hands a read frame to [`Wire::decode`],
//! applies each decoded [`Command`] at one place, and asks the wire for
//! the bytes of what it sends.
//!
//! Dispatch is a `match` over [`Wire`], not a trait object: the delivery
//! path (`Wire::outgoing`, `Wire::message`, `Wire::frame`, once per
//! delivered message) then costs a branch, no indirect call, and a frame
//! already encoded for the wire is shared (a `Bytes` clone), never copied.
//! A live message's other encoded forms are made once per node in the
//! hub's [`Outgoing`], under a [`Form`] each wire claims here.
//!
//! A new wire is a module here, a variant of [`Wire`] with its arms, and
//! (if its live pushes differ from the stored frame) a [`Form`].

use std::time::Duration;

use bytes::Bytes;
use herald_core::{Message, Receipt};
use herald_proto::centrifugo::{Method, Reply};
use herald_proto::{ChannelName, ClientFrame};
use tokio_websockets::Message as WsMessage;

use crate::error::ApiError;
use crate::hub::{Form, Outgoing};
use crate::metrics::Protocol;

pub(crate) mod centrifugo;
mod herald;

/// The encoded forms of live messages the wires claim (see `hub::FORMS`).
const CENTRIFUGO_JSON: Form = Form::new(0);
const CENTRIFUGO_PROTOBUF: Form = Form::new(1);

/// The protocol a session speaks, with the per-connection state that
/// belongs to the protocol rather than to delivery.
pub enum Wire {
    /// Herald's own (`/ws`).
    Herald,
    /// Centrifugo's client protocol v2, JSON (`/connection/websocket`).
    CentrifugoJson(Box<centrifugo::Conn>),
    /// The same, Protobuf (`/connection/websocket`, negotiated).
    CentrifugoProtobuf(Box<centrifugo::Conn>),
}

/// One command decoded from a frame, in its wire's vocabulary; the session
/// applies it at one place (`Session::apply`).
pub enum Command {
    /// A Herald frame, or why it does not parse (answered with an error).
    Herald(Result<ClientFrame, herald_proto::ClientFrameError>),
    /// A Centrifugo command: its id and method.
    Centrifugo { id: u32, method: Method },
    /// A Centrifugo command that decoded but cannot be applied: it costs a
    /// frame of the budget and is answered with `error`; the connection
    /// stays.
    Invalid { id: u32, error: ApiError },
    /// A frame the wire does not take: `reply`, if any, is sent, then the
    /// connection closes (`bad_request`) with `reason`.
    Refuse { reply: Option<Vec<u8>>, reason: &'static str },
}

/// The commands of one frame, in order.
pub enum Commands<'a> {
    One(Option<Command>),
    Lines(centrifugo::Lines<'a>),
    Binary(centrifugo::protobuf::Binary<'a>),
}

impl Iterator for Commands<'_> {
    type Item = Command;

    fn next(&mut self) -> Option<Command> {
        match self {
            Commands::One(c) => c.take(),
            Commands::Lines(lines) => lines.next(),
            Commands::Binary(messages) => messages.next(),
        }
    }
}

/// How the client acknowledges acked channels.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Acks {
    /// With `ack` frames, within a window, with redelivery.
    Frames,
    /// By the recover offset of a resubscribe: no window, no redelivery.
    RecoverOffset,
}

impl Wire {
    pub fn protocol(&self) -> Protocol {
        match self {
            Wire::Herald => Protocol::Herald,
            Wire::CentrifugoJson(_) => Protocol::Centrifugo,
            Wire::CentrifugoProtobuf(_) => Protocol::CentrifugoProtobuf,
        }
    }

    /// Whether the connection's identity is known at the upgrade (`/ws`),
    /// or set by a command (Centrifugo's `connect`).
    pub fn identified_at_upgrade(&self) -> bool {
        matches!(self, Wire::Herald)
    }

    /// The commands of a data frame (text or binary) read from the socket.
    pub fn decode<'a>(&self, msg: &'a WsMessage) -> Commands<'a> {
        match self {
            Wire::Herald => Commands::One(Some(herald::decode(msg))),
            Wire::CentrifugoJson(_) => centrifugo::decode_json(msg),
            Wire::CentrifugoProtobuf(_) => centrifugo::protobuf::decode(msg),
        }
    }

    /// A frame to send, as this wire frames it (text or binary).
    pub fn frame(&self, bytes: Bytes) -> WsMessage {
        match self {
            Wire::Herald | Wire::CentrifugoJson(_) => WsMessage::text(bytes),
            Wire::CentrifugoProtobuf(_) => WsMessage::binary(bytes),
        }
    }

    /// A message or presence frame as this wire sends it; `None` if a
    /// stored frame does not read (logged, skipped).
    pub fn message(&self, msg: &Message) -> Option<Bytes> {
        match self {
            Wire::Herald => Some(msg.frame.clone()),
            Wire::CentrifugoJson(_) => centrifugo::push_json(msg),
            Wire::CentrifugoProtobuf(_) => centrifugo::protobuf::push(msg),
        }
    }

    /// A live message from the outbox: as `message`, a form other than the
    /// stored frame made once per message on this node, not once per
    /// subscriber.
    pub fn outgoing(&self, out: &Outgoing) -> Option<Bytes> {
        match self {
            Wire::Herald => Some(out.msg.frame.clone()),
            Wire::CentrifugoJson(_) => out.encoded(CENTRIFUGO_JSON, centrifugo::push_json),
            Wire::CentrifugoProtobuf(_) => out.encoded(CENTRIFUGO_PROTOBUF, centrifugo::protobuf::push),
        }
    }

    /// The server ended a subscription.
    pub fn unsubscribed(&self, channel: &ChannelName, reason: &str) -> Vec<u8> {
        match self {
            Wire::Herald => herald_proto::encode_unsubscribed(channel, reason),
            Wire::CentrifugoJson(_) => centrifugo::unsubscribed(channel, reason).encode(),
            Wire::CentrifugoProtobuf(_) => centrifugo::protobuf::unsubscribed(channel, reason),
        }
    }

    /// The server subscribed the connection (`ok` is the subscribe's
    /// answer; `start` the seq delivery continues after).
    pub fn subscribed(&self, channel: &ChannelName, ok: &herald_proto::OkFrame, start: u64) -> Vec<u8> {
        match self {
            Wire::Herald => ok.encode_subscribed(),
            Wire::CentrifugoJson(_) => centrifugo::subscribed(channel, ok, start).encode(),
            Wire::CentrifugoProtobuf(_) => centrifugo::protobuf::subscribed(channel, ok, start),
        }
    }

    /// An error reply to request `req`.
    pub fn error(&self, err: &ApiError, req: Option<u64>, channel: Option<&str>) -> Vec<u8> {
        match self {
            Wire::Herald => err.frame(req, channel),
            Wire::CentrifugoJson(_) => centrifugo::error(err, req).encode(),
            Wire::CentrifugoProtobuf(_) => centrifugo::protobuf::reply(&centrifugo::error(err, req)),
        }
    }

    /// A Centrifugo reply, as this wire encodes it (only Centrifugo
    /// commands are answered with one).
    pub fn reply(&self, reply: &Reply<'_>) -> Vec<u8> {
        match self {
            Wire::CentrifugoProtobuf(_) => centrifugo::protobuf::reply(reply),
            Wire::Herald | Wire::CentrifugoJson(_) => reply.encode(),
        }
    }

    /// The reply to a publish that the engine took, appended to `out`.
    pub fn push_published(
        &self,
        out: &mut Vec<u8>,
        req: Option<u64>,
        channel: &ChannelName,
        receipt: &Receipt,
    ) {
        match self {
            Wire::Herald => herald::push_published(out, req, channel, receipt),
            Wire::CentrifugoJson(_) => out.extend_from_slice(&centrifugo::published(req).encode()),
            Wire::CentrifugoProtobuf(_) => {
                herald_proto::centrifugo_pb::append_reply(out, &centrifugo::published(req))
            }
        }
    }

    /// How the connection ends with one of Herald's close codes: the frame
    /// to send before the close, if the wire says why in one, and the
    /// close code on this wire.
    pub fn close(&self, code: u16, reason: &str, reconnect: bool) -> (Option<Vec<u8>>, u16) {
        match self {
            Wire::Herald => (Some(herald::disconnect(code, reason, reconnect)), code),
            // The close code alone says it.
            Wire::CentrifugoJson(_) | Wire::CentrifugoProtobuf(_) => {
                (None, herald_proto::centrifugo::disconnect_of(code))
            }
        }
    }

    /// The heartbeat's ping carrying `payload` (which the peer's answer
    /// echoes, see `session/liveness.rs`); `Err` with a close reason when
    /// the connection has waited too long for its handshake.
    pub fn ping(&mut self, payload: Bytes, idle_timeout: Duration) -> Result<WsMessage, &'static str> {
        match self {
            Wire::Herald => Ok(WsMessage::ping(payload)),
            Wire::CentrifugoJson(c) => c.ping(payload, idle_timeout, centrifugo::ping_json),
            Wire::CentrifugoProtobuf(c) => c.ping(payload, idle_timeout, centrifugo::protobuf::ping),
        }
    }

    /// How the client acknowledges acked channels.
    pub fn acks(&self) -> Acks {
        match self {
            Wire::Herald => Acks::Frames,
            Wire::CentrifugoJson(_) | Wire::CentrifugoProtobuf(_) => Acks::RecoverOffset,
        }
    }

    /// The Centrifugo connection state (`None` on other wires).
    pub fn centrifugo(&mut self) -> Option<&mut centrifugo::Conn> {
        match self {
            Wire::Herald => None,
            Wire::CentrifugoJson(c) | Wire::CentrifugoProtobuf(c) => Some(c),
        }
    }

    /// Whether the identity changed since the last call (`connect` or
    /// `refresh`: the session resets its expiry timer).
    pub fn take_identity_changed(&mut self) -> bool {
        self.centrifugo().is_some_and(|c| std::mem::take(&mut c.identity_changed))
    }
}
