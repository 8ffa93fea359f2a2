//! Herald's Server-Sent Events stream (`GET /sse`, docs/sse.md), asked for
//! over HTTP/1.0 so the response body is the event stream itself (no
//! chunked framing to undo): a `subscribed` event, then one default event
//! per message whose data is the Herald frame a `/ws` subscriber gets, read
//! by `herald::decode_bytes`. A resume sends `Last-Event-ID`.

use std::collections::VecDeque;
use std::net::Ipv4Addr;

use anyhow::{anyhow, bail, Context};
use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::{clip, herald, tcp_connect, Endpoint, Incoming, ResumePoint, Subscribed, WsAuth};
use crate::payload;

/// Read buffer growth step.
const READ_CHUNK: usize = 16 * 1024;

/// One open stream.
pub struct SseConn {
    stream: TcpStream,
    buf: BytesMut,
}

fn path(auth: &WsAuth, user: &str, channel: &str) -> String {
    match auth {
        WsAuth::Dev => format!("/sse?channel={channel}&user={user}"),
        WsAuth::Token(token) => format!("/sse?channel={channel}&token={token}&device={user}"),
    }
}

/// Open the stream of `channel` (after `resume` when it has a position) and
/// read up to its `subscribed` event.
pub async fn open(
    ep: &Endpoint,
    source: Option<Ipv4Addr>,
    user: &str,
    channel: &str,
    resume: &ResumePoint,
    pending: &mut VecDeque<Incoming>,
    deadline: Instant,
) -> anyhow::Result<(SseConn, Subscribed)> {
    let mut stream = tcp_connect(ep, source, deadline).await?;
    let mut req = format!("GET {} HTTP/1.0\r\nHost: {}\r\n", path(&ep.auth, user, channel), ep.authority);
    match (&resume.epoch, resume.last_seq) {
        (Some(epoch), Some(seq)) => req.push_str(&format!("Last-Event-ID: {epoch}:{seq}\r\n")),
        (None, Some(seq)) => req.push_str(&format!("Last-Event-ID: {seq}\r\n")),
        _ => {}
    }
    req.push_str("\r\n");
    let sent_us = payload::now_micros();
    stream.write_all(req.as_bytes()).await.context("cannot send the stream request")?;
    let mut conn = SseConn { stream, buf: BytesMut::with_capacity(READ_CHUNK) };
    // The head: a 200, or a refusal with its problem document.
    let head_end = loop {
        if let Some(i) = conn.buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if !tokio::time::timeout_at(deadline, conn.fill())
            .await
            .map_err(|_| anyhow!("no answer to GET /sse"))??
        {
            bail!("connection closed before the response head");
        }
    };
    let head = conn.buf.split_to(head_end);
    let status = head[..].split(|&b| b == b' ').nth(1).unwrap_or_default();
    if status != b"200" {
        let _ =
            tokio::time::timeout_at(deadline, async { while conn.fill().await.unwrap_or(false) {} }).await;
        bail!("stream refused: {} {}", clip(&head), clip(&conn.buf));
    }
    loop {
        let block = loop {
            if let Some(block) = conn.take_block() {
                break block;
            }
            let more = tokio::time::timeout_at(deadline, conn.fill())
                .await
                .map_err(|_| anyhow!("timed out waiting for the subscribed event"))??;
            if !more {
                bail!("the stream ended before its subscribed event");
            }
        };
        let (name, data) = fields(&block);
        if name == Some(&b"subscribed"[..]) {
            // A stream sends no acks, even on an acked channel (its inbox
            // still comes first: `unread`).
            let subscribed = Subscribed { acked: false, ..herald::read_subscribed(&data, sent_us)? };
            return Ok((conn, subscribed));
        }
        handle(name, &data, pending)?;
    }
}

impl SseConn {
    /// Read more of the stream and queue the events it completes; `false`
    /// once the stream ended.
    pub async fn read(&mut self, pending: &mut VecDeque<Incoming>) -> anyhow::Result<bool> {
        loop {
            let mut any = false;
            while let Some(block) = self.take_block() {
                let (name, data) = fields(&block);
                handle(name, &data, pending)?;
                any = true;
            }
            if any && !pending.is_empty() {
                return Ok(true);
            }
            if !self.fill().await? {
                return Ok(false);
            }
        }
    }

    /// One read from the socket into the buffer; `false` at its end.
    async fn fill(&mut self) -> anyhow::Result<bool> {
        self.buf.reserve(READ_CHUNK);
        let n = self.stream.read_buf(&mut self.buf).await.context("stream read failed")?;
        Ok(n > 0)
    }

    /// The next complete event block (without its blank line).
    fn take_block(&mut self) -> Option<BytesMut> {
        let end = self.buf.windows(2).position(|w| w == b"\n\n")?;
        let block = self.buf.split_to(end);
        self.buf.advance(2);
        Some(block)
    }
}

/// An event's name and its data (its `data:` lines joined with `\n`).
fn fields(block: &[u8]) -> (Option<&[u8]>, std::borrow::Cow<'_, [u8]>) {
    let mut name = None;
    let mut data: Option<std::borrow::Cow<'_, [u8]>> = None;
    for line in block.split(|&b| b == b'\n') {
        if let Some(v) = line.strip_prefix(b"data: ") {
            data = Some(match data {
                None => std::borrow::Cow::Borrowed(v),
                Some(d) => {
                    let mut d = d.into_owned();
                    d.push(b'\n');
                    d.extend_from_slice(v);
                    std::borrow::Cow::Owned(d)
                }
            });
        } else if let Some(v) = line.strip_prefix(b"event: ") {
            name = Some(v);
        }
    }
    (name, data.unwrap_or_default())
}

fn handle(name: Option<&[u8]>, data: &[u8], pending: &mut VecDeque<Incoming>) -> anyhow::Result<()> {
    match name {
        // A comment-only block (a ping) has no data.
        None if data.is_empty() => Ok(()),
        None | Some(b"disconnect") => herald::decode_bytes(data, pending),
        // `subscribed` of a resume, `truncated`, `epoch_changed`, ...
        Some(_) => Ok(()),
    }
}
