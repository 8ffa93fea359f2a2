//! Centrifugo's Protobuf wire (`herald_proto::centrifugo_pb`): binary
//! frames of length-prefixed messages, the same commands, replies and
//! pushes as the JSON wire. Chosen at the upgrade (`upgrade.rs`).

use bytes::Bytes;
use herald_core::Message;
use herald_proto::centrifugo::{self as cf, Reply};
use herald_proto::centrifugo_pb::{self as pb, pb::Command as PbCommand, Messages};
use herald_proto::ChannelName;
use tokio_websockets::Message as WsMessage;

use super::super::{Command, Commands};
use crate::error::ApiError;

/// The commands of a binary frame, in order. A frame that does not read
/// (or a text frame) is refused: the connection closes.
pub struct Binary<'a>(Option<Messages<'a, PbCommand>>);

impl Iterator for Binary<'_> {
    type Item = Command;

    fn next(&mut self) -> Option<Command> {
        let read = self.0.as_mut()?.next()?;
        Some(match read.map(cf::Command::try_from) {
            Ok(Ok(cmd)) => Command::Centrifugo { id: cmd.id, method: cmd.method() },
            // Decoded but not applicable: an error reply, the connection stays.
            Ok(Err(bad)) => {
                Command::Invalid { id: bad.id(), error: ApiError::new(bad.code(), bad.to_string()) }
            }
            Err(_) => {
                self.0 = None;
                Command::Refuse { reply: None, reason: "malformed command" }
            }
        })
    }
}

pub(in crate::gateway::wire) fn decode(msg: &WsMessage) -> Commands<'_> {
    if msg.is_binary() {
        // The socket already bounds the frame's size.
        let frame = msg.as_payload();
        Commands::Binary(Binary(Some(pb::decode_commands(frame, frame.len()))))
    } else {
        Commands::One(Some(Command::Refuse { reply: None, reason: "text frame" }))
    }
}

/// A message or presence frame as a Protobuf push; `None` (logged) for a
/// stored frame that does not read.
pub(in crate::gateway::wire) fn push(msg: &Message) -> Option<Bytes> {
    let push = pb::push_of_frame(msg.channel.as_str(), &msg.frame);
    if push.is_none() {
        tracing::error!(channel = %msg.channel, seq = ?msg.seq, "frame unreadable; not sent");
    }
    push.map(Bytes::from)
}

pub(in crate::gateway::wire) fn reply(reply: &Reply<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    pb::append_reply(&mut out, reply);
    out
}

pub(in crate::gateway::wire) fn unsubscribed(channel: &ChannelName, reason: &str) -> Vec<u8> {
    let mut out = Vec::new();
    pb::append_push(&mut out, &super::unsubscribed(channel, reason));
    out
}

pub(in crate::gateway::wire) fn subscribed(
    channel: &ChannelName,
    ok: &herald_proto::OkFrame,
    start: u64,
) -> Vec<u8> {
    let mut out = Vec::new();
    pb::append_push(&mut out, &super::subscribed(channel, ok, start));
    out
}

/// The server's ping: one empty message.
pub(in crate::gateway::wire) fn ping() -> WsMessage {
    WsMessage::binary(Bytes::from_static(pb::PING))
}
