//! The NATS client protocol over nats-server's WebSocket listener.
//!
//! The server opens with `INFO {...}`; the client sends `CONNECT`, `SUB` and
//! a `PING`, and the `PONG` confirms the subscription is in place. Messages
//! arrive as `MSG <subject> <sid> [reply-to] <#bytes>\r\n<payload>\r\n`, and
//! WebSocket frames need not align with protocol messages, so the parser
//! buffers. Server `PING`s are answered with `PONG`.
//!
//! Channel names map to subjects with `:` → `.` (`chat:x` → `chat.x`).

use std::collections::VecDeque;

use anyhow::{bail, Context};
use bytes::{Buf, BytesMut};
use futures_util::SinkExt;
use tokio::time::Instant;
use tokio_websockets::Message;

use super::{clip, next_data, Incoming, Subscribed, Ws};
use crate::payload;

pub const PATH: &str = "/";

/// `CONNECT` options: no echo, no verbose `+OK`s, no headers.
pub const CONNECT: &str = r#"CONNECT {"verbose":false,"pedantic":false,"echo":false,"headers":false,"lang":"herald-bench","version":"0","protocol":1}"#;

/// Largest protocol line accepted (INFO lines are a few hundred bytes).
const MAX_LINE: usize = 64 * 1024;

pub fn subject(channel: &str) -> String {
    channel.replace(':', ".")
}

pub async fn subscribe(
    ws: &mut Ws,
    channel: &str,
    parser: &mut Parser,
    pending: &mut VecDeque<Incoming>,
    deadline: Instant,
) -> anyhow::Result<Subscribed> {
    let hello = format!("{CONNECT}\r\nSUB {} 1\r\nPING\r\n", subject(channel));
    ws.send(Message::binary(hello.into_bytes())).await.context("cannot send CONNECT/SUB")?;
    while parser.pongs == 0 {
        let msg = next_data(ws, deadline, "the PONG after SUB").await?;
        if let Some(reply) = parser.feed(msg.as_payload(), pending)? {
            ws.send(reply).await?;
        }
    }
    Ok(Subscribed::default())
}

/// Incremental parser of the server side of the protocol.
#[derive(Default)]
pub struct Parser {
    buf: BytesMut,
    /// `PONG`s seen (the handshake waits for the first).
    pub pongs: u64,
    /// Server version from the `INFO` line.
    pub version: Option<String>,
}

impl Parser {
    /// Consume one WebSocket frame; deliveries go to `pending`. Returns the
    /// `PONG` to send when the server pinged.
    pub fn feed(&mut self, data: &[u8], pending: &mut VecDeque<Incoming>) -> anyhow::Result<Option<Message>> {
        self.buf.extend_from_slice(data);
        let mut pinged = false;
        loop {
            let Some(eol) = self.buf.windows(2).position(|w| w == b"\r\n") else {
                if self.buf.len() > MAX_LINE {
                    bail!("NATS protocol line too long");
                }
                break;
            };
            let line = &self.buf[..eol];
            if line.starts_with(b"MSG ") {
                let size = parse_msg_size(line)?;
                let total = eol + 2 + size + 2;
                if self.buf.len() < total {
                    break; // wait for the rest of the payload
                }
                let body = &self.buf[eol + 2..eol + 2 + size];
                let stamp =
                    payload::decode(body).with_context(|| format!("not a bench payload: {}", clip(body)))?;
                pending.push_back(Incoming::Delivery { stamp, seq: None, redelivered: false });
                self.buf.advance(total);
                continue;
            }
            if line == b"PING" {
                pinged = true;
            } else if line == b"PONG" {
                self.pongs += 1;
            } else if let Some(info) = line.strip_prefix(b"INFO ") {
                self.version = serde_json::from_slice::<serde_json::Value>(info)
                    .ok()
                    .and_then(|v| v.get("version").and_then(|v| v.as_str()).map(str::to_owned));
            } else if line.starts_with(b"-ERR") {
                bail!("NATS error: {}", clip(line));
            } else if line != b"+OK" {
                bail!("unexpected NATS line: {}", clip(line));
            }
            self.buf.advance(eol + 2);
        }
        Ok(pinged.then(|| Message::binary(&b"PONG\r\n"[..])))
    }
}

/// The payload size is the last field of `MSG subject sid [reply] size`.
fn parse_msg_size(line: &[u8]) -> anyhow::Result<usize> {
    let text = std::str::from_utf8(line).context("MSG line is not UTF-8")?;
    let size = text.rsplit(' ').next().and_then(|s| s.parse().ok());
    size.with_context(|| format!("bad MSG line: {text}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_split_frames_pings_and_info() {
        let mut p = Parser::default();
        let mut out = VecDeque::new();
        assert!(p
            .feed(b"INFO {\"version\":\"2.10.1\"}\r\nPONG\r\nMSG chat.x 1 2", &mut out)
            .unwrap()
            .is_none());
        assert_eq!((p.pongs, p.version.as_deref()), (1, Some("2.10.1")));
        assert!(p.feed(b"6\r\n{\"n\":1,\"t\":2,\"p\":\"xxxxxx\"}", &mut out).unwrap().is_none());
        assert!(out.is_empty(), "payload not complete yet");
        let reply = p.feed(b"\r\nPING\r\n", &mut out).unwrap();
        assert!(reply.is_some());
        assert!(matches!(out.pop_front(), Some(Incoming::Delivery { stamp, .. }) if stamp.n == 1));
        assert!(p.feed(b"-ERR 'Authorization Violation'\r\n", &mut out).is_err());
        assert_eq!(subject("chat:bench-1"), "chat.bench-1");
    }
}
