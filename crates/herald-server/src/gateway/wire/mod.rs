//! The wires a session speaks: how one connection's commands are decoded
//! from the frames it reads, and how its replies, pushes, pings and close
//! reasons are encoded on the socket. One module per wire:
//!
//! - `herald.rs`: Herald's JSON protocol (`/ws`, docs/protocol.md);
//! - `centrifugo/`: Centrifugo's client protocol v2, JSON and Protobuf
//!   (`/connection/websocket`, docs/centrifugo.md), with its upgrade;
//! - `sse.rs`: Server-Sent Events (`GET /sse`, docs/sse.md), write only:
//!   no commands, no acks; ids that name the stream's positions.
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
pub(crate) mod sse;

/// The encoded forms of live messages the wires claim (see `hub::FORMS`).
const CENTRIFUGO_JSON: Form = Form::new(0);
const CENTRIFUGO_PROTOBUF: Form = Form::new(1);
/// An SSE event of a stream of one channel: its id is the message's own
/// position, the same for every such stream.
const SSE_ONE_CHANNEL: Form = Form::new(2);

/// The protocol a session speaks, with the per-connection state that
/// belongs to the protocol rather than to delivery.
pub enum Wire {
    /// Herald's own (`/ws`).
    Herald,
    /// Centrifugo's client protocol v2, JSON (`/connection/websocket`).
    CentrifugoJson(Box<centrifugo::Conn>),
    /// The same, Protobuf (`/connection/websocket`, negotiated).
    CentrifugoProtobuf(Box<centrifugo::Conn>),
    /// Server-Sent Events (`/sse`): write only.
    Sse(Box<sse::Conn>),
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
    /// Not at all (a read-only stream): delivery starts after the stored
    /// cursor or the given position, with no window and no redelivery,
    /// and the cursor never moves.
    Never,
}

impl Wire {
    pub fn protocol(&self) -> Protocol {
        match self {
            Wire::Herald => Protocol::Herald,
            Wire::CentrifugoJson(_) => Protocol::Centrifugo,
            Wire::CentrifugoProtobuf(_) => Protocol::CentrifugoProtobuf,
            Wire::Sse(_) => Protocol::Sse,
        }
    }

    /// Whether the session subscribes the personal channel as it starts
    /// (`/ws`: its identity is known at the upgrade; Centrifugo's comes
    /// with `connect`, and an SSE stream has exactly the channels it named).
    pub fn starts_personal(&self) -> bool {
        matches!(self, Wire::Herald)
    }

    /// Whether the peer sends anything: an SSE stream's reader never does,
    /// so it is not timed out for silence (a failed write ends it).
    pub fn reads(&self) -> bool {
        !matches!(self, Wire::Sse(_))
    }

    /// Whether the peer can replace its token on the open socket (the
    /// Centrifugo protocol's `refresh`): such a connection gets
    /// `jwt.refresh_grace` past its token's expiry.
    pub fn refreshes_token(&self) -> bool {
        matches!(self, Wire::CentrifugoJson(_) | Wire::CentrifugoProtobuf(_))
    }

    /// Whether a subscription of a presence channel makes the connection
    /// a member (an SSE reader is not: it cannot answer the pings a lapsed
    /// lease waits for).
    pub fn joins_presence(&self) -> bool {
        !matches!(self, Wire::Sse(_))
    }

    /// The commands of a data frame (text or binary) read from the socket.
    pub fn decode<'a>(&self, msg: &'a WsMessage) -> Commands<'a> {
        match self {
            Wire::Herald => Commands::One(Some(herald::decode(msg))),
            Wire::CentrifugoJson(_) => centrifugo::decode_json(msg),
            Wire::CentrifugoProtobuf(_) => centrifugo::protobuf::decode(msg),
            // Its socket yields no frames.
            Wire::Sse(_) => Commands::One(None),
        }
    }

    /// A frame to send, as this wire frames it (text or binary).
    pub fn frame(&self, bytes: Bytes) -> WsMessage {
        match self {
            Wire::Herald | Wire::CentrifugoJson(_) => WsMessage::text(bytes),
            // The stream writes the payload as it is (`session::Socket`).
            Wire::CentrifugoProtobuf(_) | Wire::Sse(_) => WsMessage::binary(bytes),
        }
    }

    /// A message or presence frame as this wire sends it; `None` if a
    /// stored frame does not read (logged, skipped).
    pub fn message(&mut self, msg: &Message) -> Option<Bytes> {
        match self {
            Wire::Herald => Some(msg.frame.clone()),
            Wire::CentrifugoJson(_) => centrifugo::push_json(msg),
            Wire::CentrifugoProtobuf(_) => centrifugo::protobuf::push(msg),
            Wire::Sse(c) => Some(c.message(msg)),
        }
    }

    /// A live message from the outbox: as `message`, a form other than the
    /// stored frame made once per message on this node, not once per
    /// subscriber (an SSE event's id is the stream's own: made per stream).
    pub fn outgoing(&mut self, out: &Outgoing) -> Option<Bytes> {
        match self {
            Wire::Herald => Some(out.msg.frame.clone()),
            Wire::CentrifugoJson(_) => out.encoded(CENTRIFUGO_JSON, centrifugo::push_json),
            Wire::CentrifugoProtobuf(_) => out.encoded(CENTRIFUGO_PROTOBUF, centrifugo::protobuf::push),
            Wire::Sse(c) if c.channels().len() == 1 => {
                c.moved(&out.msg);
                out.encoded(SSE_ONE_CHANNEL, |m| Some(sse::one_channel_event(m)))
            }
            Wire::Sse(c) => Some(c.message(&out.msg)),
        }
    }

    /// The server ended a subscription.
    pub fn unsubscribed(&self, channel: &ChannelName, reason: &str) -> Vec<u8> {
        match self {
            Wire::Herald => herald_proto::encode_unsubscribed(channel, reason),
            Wire::CentrifugoJson(_) => centrifugo::unsubscribed(channel, reason).encode(),
            Wire::CentrifugoProtobuf(_) => centrifugo::protobuf::unsubscribed(channel, reason),
            Wire::Sse(_) => {
                sse::event(Some("unsubscribed"), None, &herald_proto::encode_unsubscribed(channel, reason))
            }
        }
    }

    /// The server subscribed the connection (`ok` is the subscribe's
    /// answer; `start` the seq delivery continues after).
    pub fn subscribed(&self, channel: &ChannelName, ok: &herald_proto::OkFrame, start: u64) -> Vec<u8> {
        match self {
            Wire::Herald => ok.encode_subscribed(),
            Wire::CentrifugoJson(_) => centrifugo::subscribed(channel, ok, start).encode(),
            Wire::CentrifugoProtobuf(_) => centrifugo::protobuf::subscribed(channel, ok, start),
            // Outside the stream's id: a reconnect does not resume it.
            Wire::Sse(_) => sse::event(Some("subscribed"), None, &ok.encode_subscribed()),
        }
    }

    /// An error reply to request `req`.
    pub fn error(&self, err: &ApiError, req: Option<u64>, channel: Option<&str>) -> Vec<u8> {
        match self {
            Wire::Herald => err.frame(req, channel),
            Wire::CentrifugoJson(_) => centrifugo::error(err, req).encode(),
            Wire::CentrifugoProtobuf(_) => centrifugo::protobuf::reply(&centrifugo::error(err, req)),
            Wire::Sse(_) => sse::event(Some("error"), None, &err.frame(req, channel)),
        }
    }

    /// A Centrifugo reply, as this wire encodes it (only Centrifugo
    /// commands are answered with one).
    pub fn reply(&self, reply: &Reply<'_>) -> Vec<u8> {
        match self {
            Wire::CentrifugoProtobuf(_) => centrifugo::protobuf::reply(reply),
            // Nothing sends SSE a command to reply to.
            Wire::Herald | Wire::CentrifugoJson(_) | Wire::Sse(_) => reply.encode(),
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
            // Nothing publishes on an SSE stream.
            Wire::Herald | Wire::Sse(_) => herald::push_published(out, req, channel, receipt),
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
            // The stream's last event; the response then ends (the browser
            // reconnects after `retry:` whatever it says).
            Wire::Sse(_) => (
                Some(sse::event(Some("disconnect"), None, &herald::disconnect(code, reason, reconnect))),
                code,
            ),
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
            // An SSE stream writes a comment line for it.
            Wire::Herald | Wire::Sse(_) => Ok(WsMessage::ping(payload)),
            Wire::CentrifugoJson(c) => c.ping(payload, idle_timeout, centrifugo::ping_json),
            Wire::CentrifugoProtobuf(c) => c.ping(payload, idle_timeout, centrifugo::protobuf::ping),
        }
    }

    /// How the client acknowledges acked channels.
    pub fn acks(&self) -> Acks {
        match self {
            Wire::Herald => Acks::Frames,
            Wire::CentrifugoJson(_) | Wire::CentrifugoProtobuf(_) => Acks::RecoverOffset,
            Wire::Sse(_) => Acks::Never,
        }
    }

    /// The Centrifugo connection state (`None` on other wires).
    pub fn centrifugo(&mut self) -> Option<&mut centrifugo::Conn> {
        match self {
            Wire::Herald | Wire::Sse(_) => None,
            Wire::CentrifugoJson(c) | Wire::CentrifugoProtobuf(c) => Some(c),
        }
    }

    /// The SSE stream's state (`None` on other wires).
    pub fn sse(&mut self) -> Option<&mut sse::Conn> {
        match self {
            Wire::Sse(c) => Some(c),
            _ => None,
        }
    }

    /// Whether the identity changed since the last call (`connect` or
    /// `refresh`: the session resets its expiry timer).
    pub fn take_identity_changed(&mut self) -> bool {
        self.centrifugo().is_some_and(|c| std::mem::take(&mut c.identity_changed))
    }
}
