//! Socket.IO (protocol 5) over Engine.IO 4, WebSocket transport only, as
//! spoken by the `socket.io` npm package and by socketioxide.
//!
//! Handshake: the server sends the Engine.IO open packet `0{...}`; the
//! client connects to the main namespace with `40`, the server answers
//! `40{"sid":...}`. The bench peers join a room on the event
//! `subscribe` with an acknowledgement: `420["subscribe","CH"]` →
//! `430[...]`. Messages arrive as `42["msg",PAYLOAD]`. Engine.IO heartbeats
//! are server-initiated: `2` (ping) must be answered with `3` (pong).

use std::collections::VecDeque;

use anyhow::{bail, Context};
use futures_util::SinkExt;
use serde::de::IgnoredAny;
use tokio::time::Instant;
use tokio_websockets::Message;

use super::{clip, next_data, Incoming, Subscribed, Ws};
use crate::payload::Stamp;

pub const PATH: &str = "/socket.io/?EIO=4&transport=websocket";

pub async fn subscribe(ws: &mut Ws, channel: &str, deadline: Instant) -> anyhow::Result<Subscribed> {
    connect(ws, deadline).await?;
    let event = serde_json::to_string(&("subscribe", channel))?;
    ws.send(Message::text(format!("420{event}"))).await.context("cannot send subscribe")?;
    loop {
        let msg = next_data(ws, deadline, "the subscribe acknowledgement").await?;
        let p: &[u8] = msg.as_payload();
        if p.starts_with(b"430") {
            return Ok(Subscribed::default());
        }
        if p == b"2" {
            ws.send(Message::text("3")).await?;
        }
    }
}

/// The Engine.IO open packet and the Socket.IO connect to the main
/// namespace, answered by `40{"sid":...}`.
pub async fn connect(ws: &mut Ws, deadline: Instant) -> anyhow::Result<()> {
    let open = next_data(ws, deadline, "the Engine.IO open packet").await?;
    if !open.as_payload().starts_with(b"0{") {
        bail!("expected an Engine.IO open packet, got {}", clip(open.as_payload()));
    }
    ws.send(Message::text("40")).await.context("cannot send the Socket.IO connect")?;
    loop {
        let msg = next_data(ws, deadline, "the Socket.IO connect reply").await?;
        let p: &[u8] = msg.as_payload();
        if p.starts_with(b"40") {
            return Ok(());
        }
        if p.starts_with(b"44") {
            bail!("Socket.IO connect refused: {}", clip(p));
        }
        if p == b"2" {
            ws.send(Message::text("3")).await?;
        }
    }
}

pub fn decode(msg: &Message, pending: &mut VecDeque<Incoming>) -> anyhow::Result<Option<Message>> {
    let p: &[u8] = msg.as_payload();
    match p {
        b"2" => return Ok(Some(Message::text("3"))),
        b"1" | b"41" => {
            pending.push_back(Incoming::Closing("Socket.IO close/disconnect packet".into()));
            return Ok(None);
        }
        _ => {}
    }
    let Some(event) = p.strip_prefix(b"42") else {
        // Other Engine.IO/Socket.IO packets (noop, acks) carry no delivery.
        return Ok(None);
    };
    let (_name, stamp): (IgnoredAny, Stamp) =
        serde_json::from_slice(event).with_context(|| format!("not a bench event: {}", clip(p)))?;
    pending.push_back(Incoming::Delivery { stamp, seq: None, redelivered: false });
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_events_and_answers_pings() {
        let mut out = VecDeque::new();
        decode(&Message::text(r#"42["msg",{"n":4,"t":9,"p":"x"}]"#), &mut out).unwrap();
        assert!(matches!(
            out.pop_front(),
            Some(Incoming::Delivery { stamp: Stamp { n: 4, t: 9 }, seq: None, redelivered: false })
        ));
        let reply = decode(&Message::text("2"), &mut out).unwrap().unwrap();
        assert_eq!(reply.as_text(), Some("3"));
        assert!(decode(&Message::text("6"), &mut out).unwrap().is_none());
        assert!(out.is_empty());
    }
}
