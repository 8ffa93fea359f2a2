//! Subscriber-side protocol adapters: open a WebSocket from a chosen source
//! address, subscribe to one channel, and turn the server's frames into
//! [`Incoming`] deliveries. One adapter per server family:
//!
//! - [`herald`]: Herald's JSON frames, with resume (`since`) on reconnect;
//! - [`plain_ws`]: the Node `ws` peer (`{"sub":CH}` → `{"ok":CH}`, then raw
//!   payloads);
//! - [`socketio`]: Engine.IO 4 / Socket.IO 5 framing (Socket.IO and
//!   socketioxide peers);
//! - [`nats`]: the NATS text protocol over the WebSocket listener;
//! - [`centrifugo`]: Herald's Centrifugo endpoint, Protobuf wire
//!   (`--wire centrifugo-protobuf`);
//! - [`sse`]: Herald's Server-Sent Events stream (`--wire sse`), the one
//!   subscriber that is not a WebSocket.
//!
//! The connection is built on tokio-websockets over a [`TcpSocket`] bound to
//! the worker's source address (herald-client's `Connection` cannot choose
//! one), and keeps per-connection client memory small.

pub mod centrifugo;
pub mod centrifugo_json;
pub mod herald;
pub mod nats;
pub mod plain_ws;
pub mod socketio;
pub mod sse;

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use futures_util::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;
use tokio_websockets::{ClientBuilder, Limits, Message};

use crate::args::{Peer, SubWire};
use crate::payload::Stamp;

pub type Ws = tokio_websockets::WebSocketStream<TcpStream>;

/// TCP connect plus upgrade plus subscribe must finish within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);

/// How a Herald subscriber authenticates.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum WsAuth {
    /// `?user=NAME` (server in `--dev` mode).
    Dev,
    /// One JWT for every connection, as `?token=`.
    Token(String),
}

/// Where the subscribers connect.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Endpoint {
    pub peer: Peer,
    pub addr: SocketAddr,
    /// `host:port` as given on the command line, for the `Host` header.
    pub authority: String,
    pub auth: WsAuth,
    /// Herald: the wire its subscribers speak.
    pub wire: SubWire,
}

/// What a subscription needs to resume where it stopped (Herald only).
#[derive(Debug, Clone, Default)]
pub struct ResumePoint {
    pub last_seq: Option<u64>,
    pub epoch: Option<String>,
}

/// The reply to a subscribe.
#[derive(Debug, Clone, Default)]
pub struct Subscribed {
    /// Herald: the channel head at subscribe time (resume point if nothing
    /// arrives before the next reconnect).
    pub head: Option<u64>,
    pub epoch: Option<String>,
    /// Herald said messages were lost to retention or a log reset.
    pub gap_reported: Option<String>,
    /// Herald: an acked channel (the reply carries a `cursor`): the
    /// subscriber must ack what it received.
    pub acked: bool,
    /// Herald, acked channels: how many messages this subscribe will
    /// deliver (the offline inbox); they follow seq `head - unread`.
    pub unread: Option<u64>,
    /// Wall clock (µs) when the subscribe request went out.
    pub sent_us: u64,
}

impl Subscribed {
    /// The seq after which this subscription's deliveries start: on an
    /// acked channel the inbox (`head - unread`), otherwise the head.
    pub fn start_after(&self) -> Option<u64> {
        match (self.head, self.unread) {
            (Some(head), Some(unread)) => Some(head.saturating_sub(unread)),
            (head, _) => head,
        }
    }
}

/// An event from the server, in arrival order.
#[derive(Debug, Clone)]
pub enum Incoming {
    /// A bench message; `seq` is the server's sequence number when the
    /// protocol has one. `redelivered`: Herald sent it again because it was
    /// not acked in time (acked channels), which is not a duplicate.
    Delivery { stamp: Stamp, seq: Option<u64>, redelivered: bool },
    /// The server announced it is closing the connection (reason).
    Closing(String),
    /// Herald acked channels: an ack for every seq up to `seq` was just
    /// written to the socket.
    Acked { seq: u64 },
}

/// What a subscriber reads from. Unboxed: each connection holds one, and
/// the WebSocket, the larger, is the common one.
#[allow(clippy::large_enum_variant)]
enum Transport {
    Ws(Ws),
    Sse(sse::SseConn),
}

/// One subscribed connection.
pub struct SubConn {
    transport: Transport,
    codec: Codec,
    pending: VecDeque<Incoming>,
    /// Herald acked channels: batches the acks.
    acker: Option<herald::Acker>,
}

/// Per-connection protocol state.
enum Codec {
    Herald,
    CentrifugoJson,
    CentrifugoProtobuf,
    PlainWs,
    SocketIo,
    Nats(nats::Parser),
}

impl SubConn {
    /// Connect from `source` (any port), upgrade, subscribe to `channel`
    /// (resuming from `resume` where the protocol can), and return once the
    /// server confirmed the subscription.
    pub async fn open(
        ep: &Endpoint,
        source: Option<Ipv4Addr>,
        user: &str,
        channel: &str,
        resume: &ResumePoint,
    ) -> anyhow::Result<(SubConn, Subscribed)> {
        // One deadline for every step, so a timeout names the step that hung.
        let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
        if ep.peer == Peer::Herald && ep.wire == SubWire::Sse {
            let mut pending = VecDeque::new();
            let (conn, subscribed) =
                sse::open(ep, source, user, channel, resume, &mut pending, deadline).await?;
            let transport = Transport::Sse(conn);
            return Ok((SubConn { transport, codec: Codec::Herald, pending, acker: None }, subscribed));
        }
        let path = match ep.peer {
            Peer::Herald if ep.wire == SubWire::CentrifugoJson => centrifugo_json::path(&ep.auth, user),
            Peer::Herald if ep.wire == SubWire::CentrifugoProtobuf => centrifugo::path(&ep.auth, user),
            Peer::Herald => herald::path(&ep.auth, user),
            Peer::Ws => plain_ws::PATH.to_owned(),
            Peer::Socketio | Peer::Socketioxide => socketio::PATH.to_owned(),
            Peer::Nats => nats::PATH.to_owned(),
            Peer::Http201 => bail!("`--peer http201` has no subscribers"),
        };
        let mut ws = connect(ep, source, &path, deadline).await?;
        let mut pending = VecDeque::new();
        let (codec, subscribed) = match ep.peer {
            Peer::Herald if ep.wire == SubWire::CentrifugoJson => (
                Codec::CentrifugoJson,
                centrifugo_json::subscribe(&mut ws, &ep.auth, channel, resume, &mut pending, deadline)
                    .await?,
            ),
            Peer::Herald if ep.wire == SubWire::CentrifugoProtobuf => (
                Codec::CentrifugoProtobuf,
                centrifugo::subscribe(&mut ws, &ep.auth, channel, resume, &mut pending, deadline).await?,
            ),
            Peer::Herald => {
                (Codec::Herald, herald::subscribe(&mut ws, channel, resume, &mut pending, deadline).await?)
            }
            Peer::Ws => (Codec::PlainWs, plain_ws::subscribe(&mut ws, channel, deadline).await?),
            Peer::Socketio | Peer::Socketioxide => {
                (Codec::SocketIo, socketio::subscribe(&mut ws, channel, deadline).await?)
            }
            Peer::Nats => {
                let mut parser = nats::Parser::default();
                let s = nats::subscribe(&mut ws, channel, &mut parser, &mut pending, deadline).await?;
                (Codec::Nats(parser), s)
            }
            Peer::Http201 => bail!("`--peer http201` has no subscribers"),
        };
        let acker = subscribed.acked.then(|| herald::Acker::new(channel));
        Ok((SubConn { transport: Transport::Ws(ws), codec, pending, acker }, subscribed))
    }

    /// The next event; `Ok(None)` when the connection ended. Control frames
    /// (WebSocket pings, Engine.IO and NATS pings) are answered here, and
    /// on Herald's acked channels every delivery handed out is acked
    /// (cumulatively, in batches; each ack sent is reported as
    /// [`Incoming::Acked`]).
    pub async fn next(&mut self) -> anyhow::Result<Option<Incoming>> {
        loop {
            if let Some(ev) = self.pending.pop_front() {
                if let (Some(acker), Incoming::Delivery { seq: Some(seq), .. }) = (&mut self.acker, &ev) {
                    acker.delivered(*seq);
                }
                return Ok(Some(ev));
            }
            let ws = match &mut self.transport {
                Transport::Ws(ws) => ws,
                Transport::Sse(sse) => {
                    if !sse.read(&mut self.pending).await? {
                        return Ok(None);
                    }
                    continue;
                }
            };
            if let Some((seq, ack)) = self.acker.as_mut().and_then(herald::Acker::take_if_full) {
                ws.send(ack).await.context("WebSocket write failed")?;
                return Ok(Some(Incoming::Acked { seq }));
            }
            let due = self.acker.as_ref().and_then(herald::Acker::due);
            let next = tokio::select! {
                next = ws.next() => next,
                () = sleep_until_opt(due) => {
                    if let Some((seq, ack)) = self.acker.as_mut().and_then(herald::Acker::take) {
                        ws.send(ack).await.context("WebSocket write failed")?;
                        return Ok(Some(Incoming::Acked { seq }));
                    }
                    continue;
                }
            };
            let Some(msg) = next else { return Ok(None) };
            let msg = msg.context("WebSocket read failed")?;
            if let Some((code, reason)) = msg.as_close() {
                self.pending.push_back(Incoming::Closing(format!("close {}: {reason}", u16::from(code))));
                continue;
            }
            if msg.is_ping() || msg.is_pong() {
                continue; // tokio-websockets answers pings itself
            }
            let reply = match &mut self.codec {
                Codec::Herald => herald::decode(&msg, &mut self.pending)?,
                Codec::CentrifugoJson => centrifugo_json::decode(&msg, &mut self.pending)?,
                Codec::CentrifugoProtobuf => centrifugo::decode(&msg, &mut self.pending)?,
                Codec::PlainWs => plain_ws::decode(&msg, &mut self.pending)?,
                Codec::SocketIo => socketio::decode(&msg, &mut self.pending)?,
                Codec::Nats(parser) => parser.feed(msg.as_payload(), &mut self.pending)?,
            };
            if let Some(reply) = reply {
                ws.send(reply).await.context("WebSocket write failed")?;
            }
        }
    }

    /// Close politely, bounded: the worker is about to exit anyway.
    pub async fn close(self) {
        if let Transport::Ws(mut ws) = self.transport {
            let _ = tokio::time::timeout(Duration::from_secs(1), ws.close()).await;
        }
    }
}

/// TCP connect from `source` and WebSocket upgrade on `path`.
pub(crate) async fn connect(
    ep: &Endpoint,
    source: Option<Ipv4Addr>,
    path: &str,
    deadline: Instant,
) -> anyhow::Result<Ws> {
    let stream = tcp_connect(ep, source, deadline).await?;
    let uri = format!("ws://{}{}", ep.authority, path);
    let uri: http::Uri = uri.parse().with_context(|| format!("bad WebSocket URI {uri}"))?;
    // A bench payload is small; the limit only guards against a broken peer.
    let builder =
        ClientBuilder::from_uri(uri).limits(Limits::default().max_payload_len(Some(16 * 1024 * 1024)));
    let (ws, _resp) = tokio::time::timeout_at(deadline, builder.connect_on(stream))
        .await
        .map_err(|_| anyhow!("no answer to the WebSocket upgrade"))?
        .context("WebSocket upgrade failed")?;
    Ok(ws)
}

/// TCP connect to the endpoint from `source`.
pub(crate) async fn tcp_connect(
    ep: &Endpoint,
    source: Option<Ipv4Addr>,
    deadline: Instant,
) -> anyhow::Result<TcpStream> {
    let socket = TcpSocket::new_v4().context("cannot create a socket")?;
    if let Some(ip) = source {
        socket.bind(SocketAddr::new(ip.into(), 0)).with_context(|| format!("cannot bind to {ip}"))?;
    }
    let stream = tokio::time::timeout_at(deadline, socket.connect(ep.addr))
        .await
        .map_err(|_| anyhow!("TCP connect to {} timed out", ep.addr))?
        .with_context(|| format!("cannot connect to {}", ep.addr))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Read the next data frame (text or binary) within the handshake deadline,
/// skipping control frames; `waiting_for` names the step in errors.
pub(crate) async fn next_data(ws: &mut Ws, deadline: Instant, waiting_for: &str) -> anyhow::Result<Message> {
    loop {
        let msg = tokio::time::timeout_at(deadline, ws.next())
            .await
            .map_err(|_| anyhow!("timed out waiting for {waiting_for}"))?
            .ok_or_else(|| anyhow!("connection closed during the handshake"))?
            .context("WebSocket read failed during the handshake")?;
        if let Some((code, reason)) = msg.as_close() {
            bail!("server closed during the handshake ({}: {reason})", u16::from(code));
        }
        if msg.is_text() || msg.is_binary() {
            return Ok(msg);
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Cut a frame for an error message.
pub(crate) fn clip(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(160)]);
    text.into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deliveries_start_after_the_inbox_on_acked_channels_else_after_the_head() {
        let durable = Subscribed { head: Some(40), ..Default::default() };
        assert_eq!(durable.start_after(), Some(40));
        let inbox = Subscribed { head: Some(40), unread: Some(25), acked: true, ..Default::default() };
        assert_eq!(inbox.start_after(), Some(15));
        let caught_up = Subscribed { head: Some(40), unread: Some(0), acked: true, ..Default::default() };
        assert_eq!(caught_up.start_after(), Some(40));
        assert_eq!(Subscribed::default().start_after(), None);
    }
}
