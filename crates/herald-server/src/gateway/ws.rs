//! `GET /ws`: authentication and the WebSocket upgrade. The page's
//! `Origin`, auth and the connection cap are checked before the 101, so a
//! refused client gets a plain HTTP status with a problem document.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use herald_proto::{check_id, ErrorCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio_websockets::{Config, Limits, ServerBuilder};

use crate::auth::Identity;
use crate::error::ApiError;
use crate::gateway::session::{Session, Socket, Wire};
use crate::state::AppState;

const WS_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// Bytes a session queues on its socket before a write is forced (the
/// session flushes after each batch anyway). tokio-websockets' default is
/// 8 KiB; a batch of small frames then goes out as several writes.
/// Matches the vendored copy's largest coalesced write (vendor/README.md).
const WRITE_BATCH_BYTES: usize = 64 * 1024;

#[derive(Deserialize)]
pub struct WsQuery {
    pub(crate) token: Option<String>,
    user: Option<String>,
    device: Option<String>,
}

/// Who connects, from what the upgrade (or an SSE request) carries: a
/// token (`Authorization: Bearer` or `?token=`), in dev mode `?user=`, and
/// with neither the connect proxy's answer if one is configured.
pub(crate) async fn identify(
    state: &AppState,
    headers: &HeaderMap,
    token: Option<&str>,
    user: Option<&str>,
    device: Option<&str>,
) -> Result<Identity, ApiError> {
    let no_token = crate::auth::bearer(headers).is_none() && token.is_none();
    match state.config().proxies.connect.as_ref() {
        // No token and a connect proxy: the backend decides (proxies.rs).
        Some(p) if no_token && user.is_none() => {
            crate::integration::proxies::connect(state, p, headers, device).await
        }
        _ => authenticate(state, headers, token, user, device).await,
    }
}

async fn authenticate(
    state: &AppState,
    headers: &HeaderMap,
    token: Option<&str>,
    user: Option<&str>,
    device: Option<&str>,
) -> Result<Identity, ApiError> {
    if let Some(device) = device {
        check_id(device).map_err(|e| ApiError::new(ErrorCode::BadRequest, format!("`device` {e}")))?;
    }
    let bearer = crate::auth::bearer(headers);
    if let Some(token) = bearer.or(token) {
        return verify_token(state, token, device).await;
    }
    match user {
        Some(user) if state.config().dev => dev_identity(user, device),
        Some(_) => Err(ApiError::new(
            ErrorCode::Forbidden,
            "token-less `?user=` connections are only accepted in --dev mode",
        )),
        None => {
            Err(ApiError::new(ErrorCode::Unauthorized, "missing token (Authorization: Bearer or ?token=)"))
        }
    }
}

/// A client JWT, verified with the configured keys (both socket protocols).
pub(crate) async fn verify_token(
    state: &AppState,
    token: &str,
    device: Option<&str>,
) -> Result<Identity, ApiError> {
    // Held by `Arc`: a JWKS refresh may be awaited.
    let jwt = state.jwt.load_full();
    if !jwt.is_configured() {
        return Err(ApiError::new(ErrorCode::Unauthorized, "this server has no JWT keys configured"));
    }
    jwt.verify(token.trim(), device).await.map_err(|e| ApiError::new(e.code, e.message))
}

/// A token-less dev-mode identity for `user` (the caller checked dev mode).
pub(crate) fn dev_identity(user: &str, device: Option<&str>) -> Result<Identity, ApiError> {
    check_id(user).map_err(|e| ApiError::new(ErrorCode::BadRequest, format!("`user` {e}")))?;
    if user.starts_with(crate::auth::RESERVED_USER_PREFIX) {
        return Err(ApiError::new(ErrorCode::BadRequest, "`user` must not start with `herald:` (reserved)"));
    }
    Ok(Identity::dev(user, device))
}

fn accept_key(headers: &HeaderMap) -> Result<String, ApiError> {
    let has_token = |name: header::HeaderName, token: &str| {
        headers
            .get_all(name)
            .iter()
            .any(|v| v.to_str().is_ok_and(|s| s.split(',').any(|p| p.trim().eq_ignore_ascii_case(token))))
    };
    if !has_token(header::UPGRADE, "websocket") || !has_token(header::CONNECTION, "upgrade") {
        return Err(ApiError::new(ErrorCode::BadRequest, "expected a WebSocket upgrade request"));
    }
    if headers.get(header::SEC_WEBSOCKET_VERSION).and_then(|v| v.to_str().ok()) != Some("13") {
        return Err(ApiError::new(ErrorCode::BadRequest, "Sec-WebSocket-Version must be 13"));
    }
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .ok_or_else(|| ApiError::new(ErrorCode::BadRequest, "missing Sec-WebSocket-Key"))?;
    let mut sha = sha1_smol::Sha1::new();
    sha.update(key.as_bytes());
    sha.update(WS_GUID.as_bytes());
    Ok(base64::engine::general_purpose::STANDARD.encode(sha.digest().bytes()))
}

/// Holds one place under the connection cap; released on drop.
pub struct ConnSlot(Arc<AppState>);

impl ConnSlot {
    pub(crate) fn acquire(state: &Arc<AppState>) -> Option<Self> {
        let prev = state.open_connections.fetch_add(1, Ordering::AcqRel);
        if prev >= state.max_connections {
            state.open_connections.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Self(state.clone()))
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.0.open_connections.fetch_sub(1, Ordering::AcqRel);
    }
}

pub async fn upgrade(
    State(state): State<Arc<AppState>>,
    query: Result<Query<WsQuery>, axum::extract::rejection::QueryRejection>,
    req: Request,
) -> Response {
    if let Err(e) = precheck(&state, req.headers()) {
        return e.into_response();
    }
    let q = match query {
        Ok(Query(q)) => q,
        Err(e) => return ApiError::new(ErrorCode::BadRequest, e.body_text()).into_response(),
    };
    let identity =
        identify(&state, req.headers(), q.token.as_deref(), q.user.as_deref(), q.device.as_deref()).await;
    let identity = match identity {
        Ok(identity) => identity,
        Err(e) => return e.into_response(),
    };
    // Before the 101: a banned user or a revoked token gets a problem.
    if let Err(e) = crate::gateway::session::admit(&state, &identity).await {
        return e.into_response();
    }
    start_session(state, req, identity, Wire::Herald)
}

/// The checks every socket endpoint makes first: shutdown, then the page's
/// `Origin` (a page on another site gets nothing else from the endpoint).
pub(crate) fn precheck(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    if state.shutdown.is_cancelled() {
        return Err(ApiError::new(ErrorCode::ShuttingDown, "server is shutting down"));
    }
    if state.sessions.is_draining() {
        let mut e = ApiError::new(ErrorCode::ShuttingDown, "this node is draining: connect to another");
        e.retry_after = Some(1);
        return Err(e);
    }
    crate::browser::check_ws_origin(state.config().dev, &state.ws_origins, headers).inspect_err(|_| {
        state.metrics.origin_refused.inc();
    })
}

/// Answer the upgrade (101) within the connection cap and hand the socket
/// to a session task speaking `wire`.
pub(crate) fn start_session(
    state: Arc<AppState>,
    mut req: Request,
    identity: Identity,
    wire: Wire,
) -> Response {
    let accept = match accept_key(req.headers()) {
        Ok(a) => a,
        Err(e) => return e.into_response(),
    };
    let Some(slot) = ConnSlot::acquire(&state) else {
        state.metrics.connections_rejected.inc();
        let mut e = ApiError::new(ErrorCode::TooManyConnections, "server is at its connection limit");
        e.retry_after = Some(5);
        return e.into_response();
    };
    let remote = forwarded_for(req.headers());
    let on_upgrade = hyper::upgrade::on(&mut req);
    let conn_id = state.next_conn_id.fetch_add(1, Ordering::Relaxed);
    let task_state = state.clone();
    // Boxed: what the task captures stays in its future for the whole
    // connection; the box is taken out of the capture and freed once the
    // identity has moved into the session.
    let identity = Box::new(identity);
    state.tasks.spawn(async move {
        let _slot = slot;
        match on_upgrade.await {
            Ok(upgraded) => {
                let identity = {
                    let boxed = identity;
                    *boxed
                };
                let limits =
                    Limits::default().max_payload_len(Some(task_state.config().websocket.max_message_bytes));
                let ws = ServerBuilder::new()
                    .limits(limits)
                    .config(Config::default().flush_threshold(WRITE_BATCH_BYTES))
                    .serve(TokioIo::new(upgraded));
                let session = Session::new(task_state, Socket::Ws(ws), identity, conn_id, wire, remote);
                session.run().await;
            }
            Err(e) => tracing::debug!(error = %e, "upgrade failed"),
        }
    });
    let mut resp = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let h = resp.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::SEC_WEBSOCKET_ACCEPT, HeaderValue::from_str(&accept).expect("base64 is a valid header"));
    resp
}

/// The client's address as the proxy in front reports it: the first entry
/// of `X-Forwarded-For`, else `X-Real-IP` (at most 64 bytes; none without
/// a proxy, as the listener does not keep the peer's address).
pub(crate) fn forwarded_for(headers: &HeaderMap) -> Option<Arc<str>> {
    let first = headers
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .or_else(|| headers.get("x-real-ip").and_then(|v| v.to_str().ok()))?
        .trim();
    (!first.is_empty() && first.len() <= 64).then(|| Arc::from(first))
}

/// The vendored tokio-websockets' batching (vendor/README.md): a socket
/// written many small frames at once takes them in a few writes, and one
/// that keeps receiving reads many frames per read. Counted on an
/// in-memory pipe: each `poll_write*`/`poll_read` that moves bytes is one
/// system call on a real socket.
#[cfg(test)]
mod io_batching_tests {
    use std::io;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use futures_util::{SinkExt, StreamExt};
    use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
    use tokio_websockets::{ClientBuilder, Config, Message, ServerBuilder};

    use super::WRITE_BATCH_BYTES;

    /// A pipe end that counts the reads and writes that moved bytes, and
    /// keeps the room offered to the last read.
    struct Counted {
        inner: DuplexStream,
        reads: Arc<AtomicUsize>,
        writes: Arc<AtomicUsize>,
        offered: Arc<AtomicUsize>,
    }

    impl AsyncRead for Counted {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let before = buf.filled().len();
            self.offered.store(buf.remaining(), Ordering::Relaxed);
            let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
            if buf.filled().len() > before {
                self.reads.fetch_add(1, Ordering::Relaxed);
            }
            polled
        }
    }

    impl AsyncWrite for Counted {
        fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
            if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
                self.writes.fetch_add(1, Ordering::Relaxed);
            }
            polled
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            // Like writev on a socket: every slice in one call.
            let all: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            self.poll_write(cx, &all)
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    fn counted(inner: DuplexStream) -> (Counted, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let (reads, writes) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let offered = Arc::new(AtomicUsize::new(0));
        (Counted { inner, reads: reads.clone(), writes: writes.clone(), offered }, reads, writes)
    }

    fn frame(i: usize) -> String {
        format!(
            r#"{{"type":"message","channel":"live:t","id":"{i:036}","ts":1,"data":{{"n":{i},"p":"{}"}}}}"#,
            "x".repeat(100)
        )
    }

    #[tokio::test]
    async fn small_frames_leave_in_few_writes_and_a_busy_reader_reads_many_per_read() {
        const N: usize = 1000;
        let (server_io, client_io) = tokio::io::duplex(4 << 20);
        let (server_io, server_reads, server_writes) = counted(server_io);
        let (client_io, client_reads, _) = counted(client_io);
        let config = Config::default().flush_threshold(WRITE_BATCH_BYTES);
        let mut server = ServerBuilder::new().config(config).serve(server_io);
        let mut client = ClientBuilder::new().take_over(client_io);

        // Server → client: N frames of ~230 bytes queued, then one flush.
        for i in 0..N {
            server.feed(Message::text(frame(i))).await.unwrap();
        }
        server.flush().await.unwrap();
        let bytes = N * (frame(0).len() + 4);
        let writes = server_writes.load(Ordering::Relaxed);
        // About one write per 64 KiB: each would be 2 slices per frame and
        // at most 32 frames per write without the coalescing.
        assert!(writes <= bytes.div_ceil(WRITE_BATCH_BYTES) + 2, "{writes} writes for {N} frames");
        for i in 0..N {
            let m = client.next().await.unwrap().unwrap();
            assert_eq!(m.as_text(), Some(frame(i).as_str()), "frame {i} arrives whole and in order");
        }
        let reads = client_reads.load(Ordering::Relaxed);
        // The read buffer grows while data keeps coming: many frames per
        // read (one per read with a fixed 256-byte buffer).
        assert!(reads * 20 <= N, "{reads} reads for {N} frames");

        // Client → server (masked frames), the other direction of the same.
        for i in 0..N {
            client.feed(Message::text(frame(i))).await.unwrap();
        }
        client.flush().await.unwrap();
        for i in 0..N {
            let m = server.next().await.unwrap().unwrap();
            assert_eq!(m.as_text(), Some(frame(i).as_str()));
        }
        let reads = server_reads.load(Ordering::Relaxed);
        assert!(reads * 20 <= N, "{reads} reads for {N} frames");

        // A frame larger than the coalescing limit between small ones keeps
        // its place.
        let big = "y".repeat(100_000);
        server.feed(Message::text(frame(0))).await.unwrap();
        server.feed(Message::text(big.clone())).await.unwrap();
        server.feed(Message::text(frame(1))).await.unwrap();
        server.flush().await.unwrap();
        assert_eq!(client.next().await.unwrap().unwrap().as_text(), Some(frame(0).as_str()));
        assert_eq!(client.next().await.unwrap().unwrap().as_text(), Some(big.as_str()));
        assert_eq!(client.next().await.unwrap().unwrap().as_text(), Some(frame(1).as_str()));
    }

    /// An idle connection's frame (a pong, an ack) is read into one small
    /// buffer: the poll that finds the socket empty after it reads into
    /// what is left of that buffer instead of making a larger one, and the
    /// buffer is let go.
    #[tokio::test]
    async fn a_lone_small_frame_is_read_without_a_second_buffer() {
        let (server_io, client_io) = tokio::io::duplex(1 << 16);
        let (server_io, _, _) = counted(server_io);
        let offered = server_io.offered.clone();
        let mut server = ServerBuilder::new().serve(server_io);
        let mut client = ClientBuilder::new().take_over(client_io);
        for round in 0..3 {
            client.send(Message::text(format!("ack {round}"))).await.unwrap();
            let m = server.next().await.unwrap().unwrap();
            assert_eq!(m.as_text(), Some(format!("ack {round}").as_str()));
            // Read into a buffer of the first size: the last round's was
            // let go, not kept (it would have less room) nor grown.
            let room = offered.load(Ordering::Relaxed);
            assert_eq!(room, 256, "round {round}: the frame was read into {room} bytes of room");
            // The socket is empty now: this poll is pending.
            assert!(futures_util::FutureExt::now_or_never(server.next()).is_none());
            let room = offered.load(Ordering::Relaxed);
            assert!(room < 256, "round {round}: the empty poll was offered {room} bytes (a new buffer)");
        }
    }
}
