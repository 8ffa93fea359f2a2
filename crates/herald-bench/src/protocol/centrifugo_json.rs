//! Herald's Centrifugo endpoint on its JSON wire (docs/centrifugo.md):
//! `connect`, `subscribe` with `recover` on reconnect, then `pub` pushes,
//! each text frame holding `\n`-separated replies; the server's ping is
//! `{}`, answered with `{}`. The wire of centrifuge-js and
//! centrifuge-python by default, measured beside `/ws` (`--wire`).
//! Replies are parsed borrowed, `data` as a raw slice, as on `/ws`.

use std::collections::VecDeque;

use anyhow::{anyhow, bail, Context};
use futures_util::SinkExt;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::time::Instant;
use tokio_websockets::Message;

use super::centrifugo::{delivery, subscribed};
use super::{clip, next_data, Incoming, ResumePoint, Subscribed, Ws, WsAuth};
use crate::payload;

const CONNECT_ID: u32 = 1;
const SUBSCRIBE_ID: u32 = 2;

pub fn path(auth: &WsAuth, user: &str) -> String {
    match auth {
        WsAuth::Dev => format!("/connection/websocket?user={user}"),
        WsAuth::Token(_) => format!("/connection/websocket?device={user}"),
    }
}

/// The fields of a reply the bench looks at.
#[derive(Deserialize)]
struct Reply<'a> {
    #[serde(default)]
    id: u32,
    #[serde(default)]
    error: Option<ErrorBody>,
    #[serde(default, borrow)]
    subscribe: Option<SubscribeResult<'a>>,
    #[serde(default, borrow)]
    push: Option<Push<'a>>,
}

#[derive(Deserialize)]
struct ErrorBody {
    code: u32,
    #[serde(default)]
    message: String,
}

#[derive(Deserialize)]
struct SubscribeResult<'a> {
    #[serde(default)]
    recovered: bool,
    #[serde(default)]
    epoch: String,
    #[serde(default)]
    offset: u64,
    #[serde(default, borrow)]
    publications: Vec<Publication<'a>>,
}

#[derive(Deserialize)]
struct Push<'a> {
    #[serde(default, borrow, rename = "pub")]
    publication: Option<Publication<'a>>,
    #[serde(default)]
    disconnect: Option<Disconnect>,
}

#[derive(Deserialize)]
struct Publication<'a> {
    #[serde(borrow)]
    data: &'a RawValue,
    #[serde(default)]
    offset: u64,
}

#[derive(Deserialize)]
struct Disconnect {
    code: u32,
    #[serde(default)]
    reason: String,
}

/// The replies of a data frame, one per line.
fn replies(msg: &Message) -> anyhow::Result<Vec<Reply<'_>>> {
    let bytes: &[u8] = msg.as_payload();
    if !msg.is_text() {
        bail!("binary frame on the JSON wire");
    }
    bytes
        .split(|&b| b == b'\n')
        .filter(|line| !line.is_empty())
        .map(|line| {
            serde_json::from_slice(line).with_context(|| format!("undecodable reply: {}", clip(line)))
        })
        .collect()
}

/// Connect, then subscribe (recovering from `resume`), returning once the
/// subscribe reply arrived; recovered publications go to `pending`.
pub async fn subscribe(
    ws: &mut Ws,
    auth: &WsAuth,
    channel: &str,
    resume: &ResumePoint,
    pending: &mut VecDeque<Incoming>,
    deadline: Instant,
) -> anyhow::Result<Subscribed> {
    let token = match auth {
        WsAuth::Token(t) => t.as_str(),
        WsAuth::Dev => "",
    };
    let connect = serde_json::json!({ "id": CONNECT_ID, "connect": { "token": token } });
    ws.send(Message::text(connect.to_string())).await.context("cannot send connect")?;
    let sent_us = payload::now_micros();
    let mut subscribe = serde_json::json!({ "channel": channel });
    if let Some(offset) = resume.last_seq {
        subscribe["recover"] = true.into();
        subscribe["offset"] = offset.into();
        subscribe["epoch"] = resume.epoch.clone().unwrap_or_default().into();
    }
    let command = serde_json::json!({ "id": SUBSCRIBE_ID, "subscribe": subscribe });
    ws.send(Message::text(command.to_string())).await.context("cannot send subscribe")?;
    loop {
        let msg = next_data(ws, deadline, "the subscribe reply").await?;
        for r in replies(&msg)? {
            if let Some(e) = r.error {
                bail!("command {} refused: {} {}", r.id, e.code, e.message);
            }
            if r.id != SUBSCRIBE_ID {
                push(r, pending)?;
                continue;
            }
            let s = r.subscribe.ok_or_else(|| anyhow!("the subscribe reply has no result"))?;
            let publications = s.publications.iter().map(|p| (p.data.get().as_bytes(), p.offset));
            return subscribed(resume, s.recovered, s.offset, s.epoch, publications, pending, sent_us);
        }
    }
}

/// A push, or the server's ping (`{}`): true.
fn push(r: Reply<'_>, pending: &mut VecDeque<Incoming>) -> anyhow::Result<bool> {
    let Some(push) = r.push else { return Ok(r.id == 0 && r.error.is_none() && r.subscribe.is_none()) };
    if let Some(p) = &push.publication {
        delivery(p.data.get().as_bytes(), p.offset, pending)?;
    } else if let Some(d) = push.disconnect {
        pending.push_back(Incoming::Closing(format!("disconnect {}: {}", d.code, d.reason)));
    }
    Ok(false)
}

/// Decode one data frame; a ping gets its pong (`{}`).
pub fn decode(msg: &Message, pending: &mut VecDeque<Incoming>) -> anyhow::Result<Option<Message>> {
    let mut ping = false;
    for r in replies(msg)? {
        ping |= push(r, pending)?;
    }
    Ok(ping.then(|| Message::text("{}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_of_pushes_and_a_ping_gives_the_deliveries_and_a_pong() {
        let data = String::from_utf8(payload::encode(5, 64)).unwrap();
        let text = format!(
            "{{\"push\":{{\"channel\":\"chat:x\",\"pub\":{{\"data\":{data},\"offset\":7,\"tags\":{{\"herald_id\":\"x\"}}}}}}}}\n{{}}"
        );
        let mut pending = VecDeque::new();
        let pong = decode(&Message::text(text), &mut pending).unwrap().expect("a pong");
        assert_eq!(pong.as_text(), Some("{}"));
        let Some(Incoming::Delivery { stamp, seq, .. }) = pending.pop_front() else { panic!("{pending:?}") };
        assert_eq!((stamp.n, seq), (5, Some(7)));
        assert!(pending.is_empty());
        assert!(decode(&Message::binary(vec![0u8]), &mut pending).is_err(), "binary is not this wire");
    }
}
