//! The Node `ws` peer (bench/peers/ws): the client sends `{"sub":CHANNEL}`,
//! the server answers `{"ok":CHANNEL}` once the socket is in the channel's
//! set, then every published payload arrives as one text frame, unchanged.

use std::collections::VecDeque;

use anyhow::{bail, Context};
use futures_util::SinkExt;
use tokio::time::Instant;
use tokio_websockets::Message;

use super::{clip, next_data, Incoming, Subscribed, Ws};
use crate::payload;

pub const PATH: &str = "/";

pub async fn subscribe(ws: &mut Ws, channel: &str, deadline: Instant) -> anyhow::Result<Subscribed> {
    let frame = serde_json::json!({ "sub": channel }).to_string();
    ws.send(Message::text(frame)).await.context("cannot send subscribe")?;
    let msg = next_data(ws, deadline, "the subscribe reply").await?;
    let reply: serde_json::Value = serde_json::from_slice(msg.as_payload())
        .with_context(|| format!("bad subscribe reply: {}", clip(msg.as_payload())))?;
    if reply.get("ok").and_then(|v| v.as_str()) != Some(channel) {
        bail!("unexpected subscribe reply: {reply}");
    }
    Ok(Subscribed::default())
}

pub fn decode(msg: &Message, pending: &mut VecDeque<Incoming>) -> anyhow::Result<Option<Message>> {
    let bytes: &[u8] = msg.as_payload();
    let stamp = payload::decode(bytes).with_context(|| format!("not a bench payload: {}", clip(bytes)))?;
    pending.push_back(Incoming::Delivery { stamp, seq: None, redelivered: false });
    Ok(None)
}
