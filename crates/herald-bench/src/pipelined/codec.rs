//! What a pipelined publisher writes and reads, per server family:
//!
//! | server | publish frame | answer |
//! |---|---|---|
//! | Herald | `{"type":"publish","req":N,"channel":CH,"data":PAYLOAD}` | `{"type":"ok","req":N,...}` or `{"type":"error","req":N,...}` |
//! | `ws` peer | `{"pub":CH,"req":N,"data":PAYLOAD}` | `{"ack":N}` or `{"err":N,"why":...}` |
//! | Socket.IO, socketioxide | `42N["publish",CH,PAYLOAD]` (event with ack id N) | `43N[...]` |
//! | NATS | `PUB subject size\r\nPAYLOAD\r\n`, and a `PING` every so often | `PONG`: every `PUB` before its `PING` |
//!
//! One publish per WebSocket frame for every server, as a client that
//! publishes one message at a time writes them. Core NATS acknowledges no
//! single `PUB`: its window is accounted with `PING`/`PONG` (what the NATS
//! clients' `flush()` does), one `PING` every [`NATS_PING_EVERY`] publishes
//! and whenever the publisher waits for room or finishes.

use std::collections::VecDeque;

use anyhow::{bail, Context};
use futures_util::SinkExt;
use serde::Deserialize;
use tokio::time::Instant;
use tokio_websockets::Message;

use crate::args::Peer;
use crate::protocol::{clip, nats, next_data, socketio, Ws, WsAuth};

/// NATS: a `PING` after this many `PUB`s at most (the window is larger, so
/// the publisher never waits on a `PONG` that no `PING` asked for).
pub const NATS_PING_EVERY: u64 = 100;

/// What an incoming frame says about the publishes in flight.
#[derive(Debug)]
pub enum Answer {
    /// Request `req` was published.
    Ok(u64),
    /// Every request up to `req` was published (NATS `PONG`).
    OkThrough(u64),
    /// Request `req` was refused; nothing was published.
    Refused { req: u64, why: String },
    /// A protocol-level reply the publisher must write (a ping answered).
    Reply(Message),
    /// The server is ending the connection, or said something that makes
    /// the rest of the run meaningless.
    Fatal(String),
}

/// Per-connection protocol state of a pipelined publisher.
pub enum PubCodec {
    Herald,
    PlainWs,
    SocketIo,
    Nats {
        parser: nats::Parser,
        /// The request each `PING` written and not yet answered covers.
        pings: VecDeque<u64>,
        /// Highest request covered by a `PING` so far.
        covered: Option<u64>,
    },
}

impl PubCodec {
    /// The codec of `peer`; `None` for a peer that takes no WebSocket
    /// publishes.
    pub fn new(peer: Peer) -> Option<Self> {
        Some(match peer {
            Peer::Herald => PubCodec::Herald,
            Peer::Ws => PubCodec::PlainWs,
            Peer::Socketio | Peer::Socketioxide => PubCodec::SocketIo,
            Peer::Nats => {
                PubCodec::Nats { parser: nats::Parser::default(), pings: VecDeque::new(), covered: None }
            }
            Peer::Http201 => return None,
        })
    }

    /// The WebSocket path to connect to.
    pub fn path(&self, auth: &WsAuth, user: &str) -> String {
        match self {
            PubCodec::Herald => crate::protocol::herald::path(auth, user),
            PubCodec::PlainWs => crate::protocol::plain_ws::PATH.to_owned(),
            PubCodec::SocketIo => socketio::PATH.to_owned(),
            PubCodec::Nats { .. } => nats::PATH.to_owned(),
        }
    }

    /// The protocol's opening after the upgrade, before the first publish.
    pub async fn handshake(&mut self, ws: &mut Ws, deadline: Instant) -> anyhow::Result<()> {
        match self {
            PubCodec::Herald | PubCodec::PlainWs => Ok(()),
            PubCodec::SocketIo => socketio::connect(ws, deadline).await,
            PubCodec::Nats { parser, .. } => {
                let hello = format!("{}\r\nPING\r\n", nats::CONNECT);
                ws.send(Message::binary(hello.into_bytes())).await.context("cannot send CONNECT")?;
                let mut ignored = VecDeque::new();
                while parser.pongs == 0 {
                    let msg = next_data(ws, deadline, "the PONG after CONNECT").await?;
                    if let Some(reply) = parser.feed(msg.as_payload(), &mut ignored)? {
                        ws.send(reply).await?;
                    }
                }
                Ok(())
            }
        }
    }

    /// How a channel name appears in this protocol's publish frame,
    /// encoded once per run: a JSON string, or a NATS subject.
    pub fn target(&self, channel: &str) -> String {
        match self {
            PubCodec::Nats { .. } => nats::subject(channel),
            _ => serde_json::to_string(channel).expect("a string serialises"),
        }
    }

    /// The frame publishing `payload` (a JSON object) to `target` as
    /// request `req`.
    pub fn publish(&self, req: u64, target: &str, payload: &[u8]) -> Message {
        let mut b = Vec::with_capacity(48 + target.len() + payload.len());
        let mut put = |parts: &[&[u8]]| parts.iter().for_each(|p| b.extend_from_slice(p));
        let req = req.to_string();
        match self {
            PubCodec::Herald => {
                put(&[
                    b"{\"type\":\"publish\",\"req\":",
                    req.as_bytes(),
                    b",\"channel\":",
                    target.as_bytes(),
                ]);
                put(&[b",\"data\":", payload, b"}"]);
            }
            PubCodec::PlainWs => {
                put(&[b"{\"pub\":", target.as_bytes(), b",\"req\":", req.as_bytes(), b",\"data\":", payload]);
                put(&[b"}"]);
            }
            PubCodec::SocketIo => {
                put(&[b"42", req.as_bytes(), b"[\"publish\",", target.as_bytes(), b",", payload, b"]"]);
            }
            PubCodec::Nats { .. } => {
                let size = payload.len().to_string();
                put(&[b"PUB ", target.as_bytes(), b" ", size.as_bytes(), b"\r\n", payload, b"\r\n"]);
                return Message::binary(b);
            }
        }
        Message::text(b)
    }

    /// After request `req` was written: NATS asks for a `PONG` every
    /// [`NATS_PING_EVERY`] publishes.
    pub fn after_publish(&mut self, req: u64) -> Option<Message> {
        let due = match self {
            PubCodec::Nats { covered, .. } => req.saturating_sub(covered.unwrap_or(0)) >= NATS_PING_EVERY,
            _ => false,
        };
        if due {
            self.cover(req)
        } else {
            None
        }
    }

    /// The publisher is about to wait (for room in the window, or for the
    /// last answers) with `last_req` the newest request written: NATS
    /// needs a `PING` after it, or nothing would ever answer it.
    pub fn before_wait(&mut self, last_req: Option<u64>) -> Option<Message> {
        match last_req {
            Some(last) if matches!(self, PubCodec::Nats { .. }) => self.cover(last),
            _ => None,
        }
    }

    fn cover(&mut self, req: u64) -> Option<Message> {
        let PubCodec::Nats { pings, covered, .. } = self else { return None };
        if covered.is_some_and(|c| c >= req) {
            return None;
        }
        *covered = Some(req);
        pings.push_back(req);
        Some(Message::binary(&b"PING\r\n"[..]))
    }

    /// Read one frame from the server into `out`.
    pub fn decode(&mut self, msg: &Message, out: &mut Vec<Answer>) -> anyhow::Result<()> {
        let bytes: &[u8] = msg.as_payload();
        match self {
            PubCodec::Herald => decode_herald(bytes, out),
            PubCodec::PlainWs => decode_plain_ws(bytes, out),
            PubCodec::SocketIo => {
                decode_socketio(bytes, out);
                Ok(())
            }
            PubCodec::Nats { parser, pings, .. } => {
                let before = parser.pongs;
                let mut deliveries = VecDeque::new();
                let reply = parser.feed(bytes, &mut deliveries)?;
                if !deliveries.is_empty() {
                    bail!("the NATS publisher received a message it did not subscribe to");
                }
                for _ in before..parser.pongs {
                    match pings.pop_front() {
                        Some(req) => out.push(Answer::OkThrough(req)),
                        None => out.push(Answer::Fatal("NATS sent a PONG nobody asked for".into())),
                    }
                }
                out.extend(reply.map(Answer::Reply));
                Ok(())
            }
        }
    }
}

/// The fields of a Herald frame a publisher looks at.
#[derive(Deserialize)]
struct HeraldFrame<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    #[serde(default)]
    req: Option<u64>,
    #[serde(default)]
    code: Option<serde_json::Value>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    reason: Option<String>,
}

fn decode_herald(bytes: &[u8], out: &mut Vec<Answer>) -> anyhow::Result<()> {
    let f: HeraldFrame<'_> =
        serde_json::from_slice(bytes).with_context(|| format!("not a Herald frame: {}", clip(bytes)))?;
    let code = || f.code.as_ref().map(|c| c.to_string()).unwrap_or_default();
    match (f.kind, f.req) {
        ("ok", Some(req)) => out.push(Answer::Ok(req)),
        ("error", Some(req)) => out.push(Answer::Refused {
            req,
            why: format!("{} {}", code(), f.message.clone().unwrap_or_default()),
        }),
        ("error", None) => out.push(Answer::Fatal(format!(
            "error frame: {} {}",
            code(),
            f.message.clone().unwrap_or_default()
        ))),
        ("disconnect", _) => out.push(Answer::Fatal(format!(
            "disconnect {}: {}",
            code(),
            f.reason.clone().unwrap_or_default()
        ))),
        ("pong", _) => {}
        (other, _) => out.push(Answer::Fatal(format!("unexpected frame `{other}`: {}", clip(bytes)))),
    }
    Ok(())
}

#[derive(Deserialize)]
struct PlainWsAnswer {
    #[serde(default)]
    ack: Option<u64>,
    #[serde(default)]
    err: Option<u64>,
    #[serde(default)]
    why: Option<String>,
}

fn decode_plain_ws(bytes: &[u8], out: &mut Vec<Answer>) -> anyhow::Result<()> {
    let a: PlainWsAnswer =
        serde_json::from_slice(bytes).with_context(|| format!("not a ws peer answer: {}", clip(bytes)))?;
    match (a.ack, a.err) {
        (Some(req), None) => out.push(Answer::Ok(req)),
        (None, Some(req)) => out.push(Answer::Refused { req, why: a.why.unwrap_or_default() }),
        _ => out.push(Answer::Fatal(format!("unexpected ws peer frame: {}", clip(bytes)))),
    }
    Ok(())
}

fn decode_socketio(bytes: &[u8], out: &mut Vec<Answer>) {
    match bytes {
        b"2" => out.push(Answer::Reply(Message::text("3"))),
        b"1" | b"41" => out.push(Answer::Fatal("Socket.IO close/disconnect packet".into())),
        _ => {
            if let Some(rest) = bytes.strip_prefix(b"43") {
                let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
                let (id, args) = rest.split_at(digits);
                match std::str::from_utf8(id).ok().and_then(|d| d.parse().ok()) {
                    Some(req) if args == br#"["ok"]"# => out.push(Answer::Ok(req)),
                    Some(req) => out.push(Answer::Refused { req, why: clip(args) }),
                    None => out.push(Answer::Fatal(format!("Socket.IO ack without an id: {}", clip(bytes)))),
                }
            }
            // Other packets (noop, events for other sockets) answer nothing.
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(m: &Message) -> String {
        String::from_utf8(m.as_payload().to_vec()).unwrap()
    }

    /// The Herald publish frame is written by hand for speed: it must be
    /// what the server's parser (`herald_proto::ClientFrame`) reads, `data`
    /// byte for byte.
    #[test]
    fn herald_publish_frames_parse_as_the_server_reads_them() {
        let payload = br#"{"n":1,"t":2,"p":"x"}"#;
        let herald = PubCodec::new(Peer::Herald).unwrap();
        let f = herald.publish(9, &herald.target("chat:a"), payload);
        match herald_proto::ClientFrame::parse(&text(&f)).unwrap() {
            herald_proto::ClientFrame::Publish { req, channel, data, meta, idempotency_key } => {
                assert_eq!(
                    (req, channel.as_str(), data.get()),
                    (Some(9), "chat:a", r#"{"n":1,"t":2,"p":"x"}"#)
                );
                assert!(meta.is_none() && idempotency_key.is_none());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn publish_frames_per_protocol() {
        let payload = br#"{"n":1,"t":2,"p":"x"}"#;
        let herald = PubCodec::new(Peer::Herald).unwrap();
        let t = herald.target("chat:a");
        let f = herald.publish(7, &t, payload);
        assert!(f.is_text());
        let v: serde_json::Value = serde_json::from_str(&text(&f)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type":"publish","req":7,"channel":"chat:a","data":{"n":1,"t":2,"p":"x"}})
        );
        let ws = PubCodec::new(Peer::Ws).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&text(&ws.publish(3, &ws.target("c"), payload))).unwrap();
        assert_eq!(v, serde_json::json!({"pub":"c","req":3,"data":{"n":1,"t":2,"p":"x"}}));
        let sio = PubCodec::new(Peer::Socketio).unwrap();
        assert_eq!(
            text(&sio.publish(12, &sio.target("c"), payload)),
            r#"4212["publish","c",{"n":1,"t":2,"p":"x"}]"#
        );
        let nats = PubCodec::new(Peer::Nats).unwrap();
        let f = nats.publish(1, &nats.target("chat:a"), payload);
        assert!(f.is_binary());
        assert_eq!(text(&f), "PUB chat.a 21\r\n{\"n\":1,\"t\":2,\"p\":\"x\"}\r\n");
    }

    #[test]
    fn herald_answers() {
        let mut c = PubCodec::new(Peer::Herald).unwrap();
        let mut out = Vec::new();
        let frame = |s: &'static str| Message::text(s);
        c.decode(
            &frame(r#"{"type":"ok","req":4,"channel":"chat:a","seq":9,"id":"x","duplicate":false}"#),
            &mut out,
        )
        .unwrap();
        c.decode(&frame(r#"{"type":"ok","req":5,"channel":"live:a","id":"y"}"#), &mut out).unwrap();
        c.decode(&frame(r#"{"type":"error","req":6,"code":"rate_limited","message":"slow down"}"#), &mut out)
            .unwrap();
        c.decode(&frame(r#"{"type":"disconnect","code":4009,"reason":"rate limited"}"#), &mut out).unwrap();
        assert!(matches!(out[0], Answer::Ok(4)));
        assert!(matches!(out[1], Answer::Ok(5)));
        assert!(matches!(&out[2], Answer::Refused { req: 6, why } if why.contains("rate_limited")));
        assert!(matches!(&out[3], Answer::Fatal(why) if why.contains("4009")));
        assert!(c.decode(&frame("nope"), &mut out).is_err());
    }

    #[test]
    fn ws_peer_and_socketio_answers() {
        let mut out = Vec::new();
        let mut ws = PubCodec::new(Peer::Ws).unwrap();
        ws.decode(&Message::text(r#"{"ack":3}"#), &mut out).unwrap();
        ws.decode(&Message::text(r#"{"err":4,"why":"bad json"}"#), &mut out).unwrap();
        assert!(matches!(out.remove(0), Answer::Ok(3)));
        assert!(matches!(out.remove(0), Answer::Refused { req: 4, why } if why == "bad json"));
        let mut sio = PubCodec::new(Peer::Socketioxide).unwrap();
        sio.decode(&Message::text(r#"4312["ok"]"#), &mut out).unwrap();
        sio.decode(&Message::text(r#"4313["error: buffer full"]"#), &mut out).unwrap();
        sio.decode(&Message::text("2"), &mut out).unwrap();
        sio.decode(&Message::text("6"), &mut out).unwrap();
        assert!(matches!(out.remove(0), Answer::Ok(12)));
        assert!(matches!(out.remove(0), Answer::Refused { req: 13, why } if why.contains("buffer full")));
        assert!(matches!(out.remove(0), Answer::Reply(m) if m.as_text() == Some("3")));
        assert!(out.is_empty());
    }

    #[test]
    fn nats_pings_cover_publishes_and_pongs_answer_them_in_order() {
        let mut c = PubCodec::new(Peer::Nats).unwrap();
        // Nothing written yet: nothing to cover.
        assert!(c.before_wait(None).is_none());
        for req in 1..NATS_PING_EVERY {
            assert!(c.after_publish(req).is_none());
        }
        let ping = c.after_publish(NATS_PING_EVERY).expect("a PING every NATS_PING_EVERY publishes");
        assert_eq!(text(&ping), "PING\r\n");
        assert!(c.before_wait(Some(NATS_PING_EVERY)).is_none(), "already covered");
        assert!(c.after_publish(NATS_PING_EVERY + 1).is_none());
        assert!(c.before_wait(Some(NATS_PING_EVERY + 1)).is_some(), "waiting: cover the last publish");
        let mut out = Vec::new();
        c.decode(&Message::binary(&b"PONG\r\nPING\r\nPONG\r\n"[..]), &mut out).unwrap();
        assert!(matches!(out[0], Answer::OkThrough(NATS_PING_EVERY)));
        assert!(matches!(out[1], Answer::OkThrough(r) if r == NATS_PING_EVERY + 1));
        assert!(matches!(&out[2], Answer::Reply(m) if &m.as_payload()[..] == b"PONG\r\n"));
        out.clear();
        c.decode(&Message::binary(&b"PONG\r\n"[..]), &mut out).unwrap();
        assert!(matches!(&out[0], Answer::Fatal(_)));
        assert!(c.decode(&Message::binary(&b"-ERR 'Maximum Payload Violation'\r\n"[..]), &mut out).is_err());
    }
}
