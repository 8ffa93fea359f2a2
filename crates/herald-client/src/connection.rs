//! [`Connection`]: one WebSocket connection, no retries, no hidden state
//! beyond the frames buffered while waiting for a reply. Tests use it to
//! assert exact wire behaviour; the [`crate::Client`] worker drives one at a
//! time.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use herald_proto::{MessageView, OutFrame, Since};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_websockets::{CloseCode, Limits, Message, WebSocketStream};

use crate::handshake::{self, Prefixed};
use crate::url::BaseUrl;
use crate::ClientError;

/// TCP connect plus upgrade must finish within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest frame accepted from the server. Herald's own limit on messages is
/// far below this; it only stops a broken peer from exhausting memory.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;
/// Most frames [`Connection::request`] buffers while it waits for a reply.
pub const MAX_BUFFERED_FRAMES: usize = 100_000;

/// How a connection authenticates.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum Auth {
    /// A JWT, sent as `Authorization: Bearer` (or `?token=` when
    /// [`ConnectOptions::token_in_query`] is set).
    Token(String),
    /// Dev mode only: `?user=NAME`, no token.
    DevUser(String),
    /// No credentials (to test refusals).
    #[default]
    None,
}

// Tokens are secrets: never printed, not even in debug output.
impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Auth::Token(_) => f.write_str("Token(<redacted>)"),
            Auth::DevUser(u) => f.debug_tuple("DevUser").field(u).finish(),
            Auth::None => f.write_str("None"),
        }
    }
}

/// Where and how to connect.
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    /// Server base address: `http://host:port` or `ws://host:port`, optionally
    /// with a path prefix. `/ws` is appended unless the path already ends
    /// with it.
    pub url: String,
    pub auth: Auth,
    /// Send an [`Auth::Token`] as `?token=` instead of a header.
    pub token_in_query: bool,
    /// `?device=ID`: part of the subscriber identity on acked channels.
    pub device: Option<String>,
}

impl ConnectOptions {
    pub fn new(url: impl Into<String>, auth: Auth) -> Self {
        Self { url: url.into(), auth, token_in_query: false, device: None }
    }

    /// Dev mode: connect as `user` without a token.
    pub fn dev_user(url: impl Into<String>, user: impl Into<String>) -> Self {
        Self::new(url, Auth::DevUser(user.into()))
    }

    /// Connect with a JWT in the `Authorization` header.
    pub fn token(url: impl Into<String>, token: impl Into<String>) -> Self {
        Self::new(url, Auth::Token(token.into()))
    }

    pub fn with_device(mut self, device: impl Into<String>) -> Self {
        self.device = Some(device.into());
        self
    }

    pub fn with_token_in_query(mut self, yes: bool) -> Self {
        self.token_in_query = yes;
        self
    }
}

/// What [`Connection::next_frame`] yields.
// `Frame` is large, but each event is moved a couple of times at most;
// boxing would cost an allocation per frame instead.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum ServerEvent {
    /// A text frame: `ok`, `message`, `error`, `pong`, `disconnect`, ...
    Frame(MessageView),
    /// The server closed the socket. `code` is `None` when the close frame
    /// had no code or the TCP connection ended without a close frame.
    Closed { code: Option<u16>, reason: String },
}

impl ServerEvent {
    pub fn frame(&self) -> Option<&MessageView> {
        match self {
            ServerEvent::Frame(v) => Some(v),
            ServerEvent::Closed { .. } => None,
        }
    }

    pub fn into_frame(self) -> Option<MessageView> {
        match self {
            ServerEvent::Frame(v) => Some(v),
            ServerEvent::Closed { .. } => None,
        }
    }
}

/// One WebSocket connection to Herald.
///
/// Invariants:
/// - `buffered` holds events read off the socket but not yet returned by
///   [`Connection::next_frame`], in arrival order; `next_frame` drains it
///   before reading the socket, so callers see every frame exactly once and
///   in order.
/// - `next_frame` is cancel-safe: its only await points are the socket read
///   (which keeps partial frames inside the stream) and, after a close, the
///   flush of the close acknowledgement, before which the `Closed` event is
///   already stashed in `buffered`.
/// - Server pings are answered by tokio-websockets while the socket is being
///   read, so a connection nobody reads stops answering pings.
pub struct Connection {
    ws: WebSocketStream<Prefixed<TcpStream>>,
    buffered: VecDeque<ServerEvent>,
    next_req: u64,
    last_rx: Instant,
    /// The stream has ended (close frame seen, EOF, or a read error).
    ended: bool,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("buffered", &self.buffered.len())
            .field("next_req", &self.next_req)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Connect and upgrade. A refused upgrade is
    /// [`ClientError::Rejected`] with the HTTP status and problem `code`.
    pub async fn connect(opts: &ConnectOptions) -> Result<Self, ClientError> {
        Self::handshake(opts, None).await
    }

    /// Like [`Connection::connect`], on a TCP stream the caller already
    /// connected to the server in `opts.url` (to pick the local address,
    /// as a load generator spreading 15,000 connections over several source
    /// IPs must).
    pub async fn connect_on(opts: &ConnectOptions, stream: TcpStream) -> Result<Self, ClientError> {
        Self::handshake(opts, Some(stream)).await
    }

    async fn handshake(opts: &ConnectOptions, stream: Option<TcpStream>) -> Result<Self, ClientError> {
        let base = BaseUrl::parse(&opts.url)?;
        let mut params: Vec<(&str, &str)> = Vec::with_capacity(2);
        let bearer;
        let mut headers: Vec<(&str, &str)> = Vec::with_capacity(1);
        match &opts.auth {
            Auth::Token(t) if opts.token_in_query => params.push(("token", t)),
            Auth::Token(t) => {
                if t.bytes().any(|b| b.is_ascii_control()) {
                    return Err(ClientError::Config("token contains control characters".into()));
                }
                bearer = format!("Bearer {t}");
                headers.push(("Authorization", &bearer));
            }
            Auth::DevUser(u) => params.push(("user", u)),
            Auth::None => {}
        }
        if let Some(device) = &opts.device {
            params.push(("device", device));
        }
        let target = base.ws_target(&params);
        let upgrade = async {
            match stream {
                Some(stream) => handshake::upgrade_on(stream, &target, &headers).await,
                None => handshake::upgrade(&target, &headers).await,
            }
        };
        let stream =
            tokio::time::timeout(HANDSHAKE_TIMEOUT, upgrade).await.map_err(|_| ClientError::Timeout)??;
        let ws = tokio_websockets::ClientBuilder::new()
            .limits(Limits::default().max_payload_len(Some(MAX_FRAME_BYTES)))
            .take_over(stream);
        Ok(Self { ws, buffered: VecDeque::new(), next_req: 1, last_rx: Instant::now(), ended: false })
    }

    /// Send one text frame exactly as given (for malformed-frame tests).
    pub async fn send_raw(&mut self, text: &str) -> Result<(), ClientError> {
        self.send_text(text.to_owned()).await
    }

    /// Send one JSON frame.
    pub async fn send(&mut self, frame: &serde_json::Value) -> Result<(), ClientError> {
        self.send_text(frame.to_string()).await
    }

    pub(crate) async fn send_text(&mut self, text: String) -> Result<(), ClientError> {
        self.ws.send(Message::text(text)).await.map_err(ClientError::from)
    }

    /// Send a WebSocket ping (not a Herald `ping` frame); the peer's library
    /// answers it with a pong, which counts as activity.
    pub(crate) async fn send_ws_ping(&mut self) -> Result<(), ClientError> {
        self.ws.send(Message::ping(&b"hb"[..])).await.map_err(ClientError::from)
    }

    /// When the last frame of any kind (including pings and pongs) arrived.
    pub(crate) fn last_activity(&self) -> Instant {
        self.last_rx
    }

    /// The next event: buffered ones first, then the socket. `Ok(None)` once
    /// the connection has ended and the `Closed` event was returned.
    pub async fn next_frame(&mut self) -> Result<Option<ServerEvent>, ClientError> {
        if let Some(ev) = self.buffered.pop_front() {
            return Ok(Some(ev));
        }
        self.read_event().await
    }

    /// Allocate the next `req` number. [`Connection::request`] uses the same
    /// counter, so mixing the two never reuses a number.
    pub fn next_req(&mut self) -> u64 {
        let req = self.next_req;
        self.next_req += 1;
        req
    }

    /// Set `req` on `frame` (which must be a JSON object), send it, and wait
    /// for the `ok`, `error` or `pong` carrying that `req`. Other frames that
    /// arrive meanwhile (messages, other replies) are kept, in order, for
    /// [`Connection::next_frame`]. An `error` reply is returned as `Ok`; see
    /// [`Connection::request_ok`] to get it as an `Err`.
    ///
    /// No timeout: wrap in `tokio::time::timeout` where a test needs one.
    pub async fn request(&mut self, mut frame: serde_json::Value) -> Result<MessageView, ClientError> {
        let req = self.next_req();
        let obj = frame
            .as_object_mut()
            .ok_or_else(|| ClientError::Config("a request frame must be a JSON object".into()))?;
        obj.insert("req".into(), req.into());
        self.send(&frame).await?;
        self.reply(req).await
    }

    /// Like [`Connection::request`], but an `error` reply becomes
    /// [`ClientError::Server`].
    pub async fn request_ok(&mut self, frame: serde_json::Value) -> Result<MessageView, ClientError> {
        let reply = self.request(frame).await?;
        if reply.kind == "error" {
            return Err(ClientError::from_error_frame(&reply));
        }
        Ok(reply)
    }

    /// Wait for the reply to `req` (sent earlier with [`Connection::send`]),
    /// buffering everything else. Looks in the buffer first.
    pub async fn reply(&mut self, req: u64) -> Result<MessageView, ClientError> {
        let is_reply = |ev: &ServerEvent| matches!(ev, ServerEvent::Frame(v) if v.req == Some(req) && v.kind != "message");
        if let Some(pos) = self.buffered.iter().position(is_reply) {
            if let Some(ServerEvent::Frame(v)) = self.buffered.remove(pos) {
                return Ok(v);
            }
        }
        loop {
            match self.read_event().await? {
                Some(ServerEvent::Frame(v)) if v.req == Some(req) && v.kind != "message" => return Ok(v),
                Some(ServerEvent::Closed { code, reason }) => {
                    self.buffered.push_back(ServerEvent::Closed { code, reason: reason.clone() });
                    return Err(ClientError::Closed { code, reason });
                }
                Some(ev) => {
                    if self.buffered.len() >= MAX_BUFFERED_FRAMES {
                        return Err(ClientError::Protocol(format!(
                            "more than {MAX_BUFFERED_FRAMES} frames arrived while waiting for reply {req}"
                        )));
                    }
                    self.buffered.push_back(ev);
                }
                None => {
                    return Err(ClientError::Closed {
                        code: None,
                        reason: "connection already closed".into(),
                    })
                }
            }
        }
    }

    /// `subscribe` request; `since` is `(seq, epoch)`.
    pub async fn subscribe(
        &mut self,
        channel: &str,
        since: Option<(u64, &str)>,
    ) -> Result<MessageView, ClientError> {
        let since = since.map(|(seq, epoch)| Since { seq, epoch: Some(epoch.to_owned()) });
        let req = self.next_req();
        self.send_out(&OutFrame::Subscribe { req: Some(req), channel, since, client_id: None, info: None })
            .await?;
        self.reply(req).await
    }

    /// `unsubscribe` request.
    pub async fn unsubscribe(&mut self, channel: &str) -> Result<MessageView, ClientError> {
        let req = self.next_req();
        self.send_out(&OutFrame::Unsubscribe { req: Some(req), channel }).await?;
        self.reply(req).await
    }

    /// `publish` request.
    pub async fn publish(
        &mut self,
        channel: &str,
        data: &serde_json::Value,
        idempotency_key: Option<&str>,
    ) -> Result<MessageView, ClientError> {
        let data = serde_json::value::to_raw_value(data)
            .map_err(|e| ClientError::Config(format!("publish data does not serialise: {e}")))?;
        let req = self.next_req();
        let frame = OutFrame::Publish { req: Some(req), channel, data: &data, meta: None, idempotency_key };
        self.send_out(&frame).await?;
        self.reply(req).await
    }

    /// Herald-level `ping` request; the reply is a `pong`.
    pub async fn ping(&mut self) -> Result<MessageView, ClientError> {
        let req = self.next_req();
        self.send_out(&OutFrame::Ping { req: Some(req) }).await?;
        self.reply(req).await
    }

    /// Send one client frame, encoded by `herald-proto`.
    pub async fn send_out(&mut self, frame: &OutFrame<'_>) -> Result<(), ClientError> {
        self.send_text(frame.encode()).await
    }

    /// Close with `code` (`None`: no code) and wait for the server's close.
    /// Text frames that arrive before it stay buffered.
    pub async fn close(&mut self, code: Option<u16>, reason: &str) -> Result<(), ClientError> {
        if self.ended {
            return Ok(());
        }
        let code = code
            .map(|c| {
                CloseCode::try_from(c).map_err(|_| ClientError::Config(format!("invalid close code {c}")))
            })
            .transpose()?;
        match self.ws.send(Message::close(code, reason)).await {
            Ok(()) | Err(tokio_websockets::Error::AlreadyClosed) => {}
            Err(e) => return Err(e.into()),
        }
        loop {
            match self.read_event().await {
                Ok(Some(ServerEvent::Frame(v))) => self.buffered.push_back(ServerEvent::Frame(v)),
                Ok(Some(ServerEvent::Closed { .. })) | Ok(None) | Err(_) => return Ok(()),
            }
        }
    }

    /// Read the socket until a text frame or the end. Pings, pongs and other
    /// control frames only update `last_rx`.
    async fn read_event(&mut self) -> Result<Option<ServerEvent>, ClientError> {
        loop {
            if self.ended {
                return Ok(None);
            }
            let msg = match self.ws.next().await {
                Some(Ok(msg)) => msg,
                Some(Err(e)) => {
                    self.ended = true;
                    return Err(e.into());
                }
                None => {
                    self.ended = true;
                    return Ok(Some(ServerEvent::Closed {
                        code: None,
                        reason: "connection ended without a close frame".into(),
                    }));
                }
            };
            self.last_rx = Instant::now();
            if let Some(text) = msg.as_text() {
                return match MessageView::parse(text.as_bytes()) {
                    Ok(view) => Ok(Some(ServerEvent::Frame(view))),
                    Err(e) => Err(ClientError::Protocol(format!("not a Herald frame ({e}): {}", clip(text)))),
                };
            }
            if let Some((code, reason)) = msg.as_close() {
                let code = u16::from(code);
                let event = ServerEvent::Closed {
                    code: (code != u16::from(CloseCode::NO_STATUS_RECEIVED)).then_some(code),
                    reason: reason.to_owned(),
                };
                self.ended = true;
                // Stash first: the flush below may be cancelled.
                self.buffered.push_back(event);
                // tokio-websockets queued the close acknowledgement; the next
                // poll flushes it and ends the stream.
                let _ = self.ws.next().await;
                return Ok(self.buffered.pop_back());
            }
            if msg.is_binary() {
                return Err(ClientError::Protocol("binary frame from the server".into()));
            }
        }
    }
}

/// The first bytes of a frame, for error messages.
fn clip(text: &str) -> &str {
    let mut end = text.len().min(200);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
