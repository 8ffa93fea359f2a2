//! Every accepted TCP connection, from `accept` until it is a WebSocket
//! session or closed: the HTTP connection cap, the timeouts that bound a
//! connection before its request is complete, and the HTTP/1.1 and HTTP/2
//! serving.
//!
//! HTTP/2 is cleartext with prior knowledge (`http.http2`): a connection
//! whose first 24 bytes are HTTP/2's preface is served as HTTP/2, any other
//! as HTTP/1.1 (the bytes read to tell are handed to hyper first). No
//! upgrade from HTTP/1.1 (`h2c` in `Upgrade`) and no TLS: a backend that
//! wants to multiplex publishes on one connection opens it as HTTP/2.
//!
//! A connection moves through phases (see [`Phase`]); each phase has one
//! clock and one deadline, enforced by a watchdog in the connection's task:
//!
//! | phase | from | deadline |
//! |---|---|---|
//! | `Fresh` | accept | `header_read_timeout` after accept |
//! | `Head` | a request's first byte | `header_read_timeout` (after accept for the first request) |
//! | `Busy` | headers complete (request dispatched) | none here: the body has `body_read_timeout` ([`body`]), handlers are bounded by the engine |
//! | `Idle` | the response (on HTTP/2, the last of the requests in flight) | `keep_alive_timeout`, restarted while a response is still being written; on HTTP/2 bytes that start no request (pings, window updates) do not end it |
//! | `Upgraded` | the 101, or an HTTP/1.1 [`Streaming`] response (SSE) | none: the session has its own pings and idle timeout |
//!
//! hyper's own `header_read_timeout` is not used: its clock starts when hyper
//! begins waiting for a head (at accept, and again right after each
//! response), so one value would bound both a slow head and a keep-alive
//! pause; we want a short bound on the first and a long one on the second.
//!
//! The cap: at most `max_http_connections` connections are open outside
//! WebSocket sessions (those have their own cap). At the cap a new connection
//! evicts the oldest one that has never had a request dispatched and is not
//! busy (silent or slow sockets), else the oldest keep-alive connection that
//! is not busy; if every connection is busy, the new one is closed. So
//! pre-request sockets can never hold more than `max_http_connections`
//! descriptors, and a new connection (a health check) always gets a place
//! unless every place holds a request in progress, which the body and handler
//! bounds end.
//!
//! A [`Streaming`] response (an SSE stream) is a session, counted under the
//! session cap: on HTTP/1.1 its connection leaves this cap when the
//! response starts, as an upgraded one does, and closes when the stream
//! ends (`Connection: close`). On HTTP/2 the stream's request stays in
//! flight until its body ends, so the connection is busy meanwhile.

pub(crate) mod body;
mod io;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderValue, Request, Response, StatusCode};
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::{TowerToHyperService, TowerToHyperServiceFuture};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower_http::set_header::SetResponseHeader;

use crate::config::HttpConfig;
use crate::metrics::Metrics;

/// Where a connection is in its life; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    Fresh = 0,
    Head = 1,
    Busy = 2,
    Idle = 3,
    Upgraded = 4,
}

impl Phase {
    fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::Fresh,
            1 => Phase::Head,
            2 => Phase::Busy,
            3 => Phase::Idle,
            _ => Phase::Upgraded,
        }
    }
}

/// One accepted connection's shared state: written by its own task (the IO
/// wrapper, the service, the watchdog), read by the acceptor to pick whom
/// to evict.
pub(crate) struct Conn {
    id: u64,
    phase: AtomicU8,
    /// A request has been dispatched on this connection.
    served: AtomicBool,
    /// Requests dispatched and not yet answered (at most one on HTTP/1.1).
    in_flight: AtomicU32,
    /// HTTP/2: several requests at once, and bytes between requests that
    /// are not a request's head.
    multiplexed: AtomicBool,
    /// Start of the current phase's clock, in ms since `epoch`.
    since_ms: AtomicU64,
    epoch: Instant,
    /// Cancelled when the connection is evicted at the cap.
    evicted: CancellationToken,
    /// The registry holding it (an HTTP/1.1 stream leaves it).
    registry: std::sync::Weak<Connections>,
}

/// Marks a response that streams for as long as a session (an SSE stream):
/// see the module docs.
#[derive(Clone, Copy)]
pub(crate) struct Streaming;

impl Conn {
    fn new(id: u64, epoch: Instant, registry: std::sync::Weak<Connections>) -> Conn {
        let c = Conn {
            id,
            phase: AtomicU8::new(Phase::Fresh as u8),
            served: AtomicBool::new(false),
            in_flight: AtomicU32::new(0),
            multiplexed: AtomicBool::new(false),
            since_ms: AtomicU64::new(0),
            epoch,
            evicted: CancellationToken::new(),
            registry,
        };
        c.restart_clock();
        c
    }

    /// A [`Streaming`] response is starting: on HTTP/1.1 the connection
    /// is the session's from now on (out of this cap, no deadline, closed
    /// after the stream); on HTTP/2 the request stays in flight until the
    /// body ends.
    fn start_stream(self: &Arc<Self>, resp: Response<axum::body::Body>) -> Response<axum::body::Body> {
        if self.multiplexed.load(Ordering::Acquire) {
            let conn = self.clone();
            return resp.map(|inner| axum::body::Body::new(InFlight { inner, conn }));
        }
        self.end_request(true);
        if let Some(registry) = self.registry.upgrade() {
            registry.release(self.id);
        }
        let mut resp = resp;
        resp.headers_mut().insert(axum::http::header::CONNECTION, HeaderValue::from_static("close"));
        resp
    }

    fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Acquire))
    }

    fn set_phase(&self, p: Phase) {
        self.phase.store(p as u8, Ordering::Release);
    }

    fn restart_clock(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.since_ms.store(ms, Ordering::Release);
    }

    fn since(&self) -> Instant {
        self.epoch + Duration::from_millis(self.since_ms.load(Ordering::Acquire))
    }

    /// Bytes arrived. Between HTTP/1.1 requests they start a head (and its
    /// clock); the first request's head is timed from accept. Between
    /// HTTP/2 requests they may be pings: the idle clock keeps running.
    fn on_read(&self) {
        match self.phase() {
            Phase::Fresh => self.set_phase(Phase::Head),
            Phase::Idle if self.multiplexed.load(Ordering::Acquire) => {}
            Phase::Idle => {
                self.restart_clock();
                self.set_phase(Phase::Head);
            }
            Phase::Head | Phase::Busy | Phase::Upgraded => {}
        }
    }

    /// Bytes went out: a response still being written keeps the idle clock
    /// from running out under a slow but reading client.
    fn on_write(&self) {
        if self.phase() == Phase::Idle {
            self.restart_clock();
        }
    }

    /// hyper dispatched a request (its headers are complete).
    fn begin_request(&self) {
        self.served.store(true, Ordering::Release);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.set_phase(Phase::Busy);
    }

    /// The service answered; a 101 hands the connection to a WebSocket
    /// session. The connection is idle once no request is in flight.
    fn end_request(&self, upgraded: bool) {
        if upgraded {
            self.set_phase(Phase::Upgraded);
        } else if self.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.restart_clock();
            self.set_phase(Phase::Idle);
            // A request dispatched between the count and the phase (HTTP/2)
            // keeps the connection busy.
            if self.in_flight.load(Ordering::Acquire) > 0 {
                self.set_phase(Phase::Busy);
            }
        }
    }

    /// Whether the IO wrapper may be looking at hyper's own answer to a
    /// request head it could not parse.
    fn reading_head(&self) -> bool {
        self.phase() == Phase::Head
    }

    fn upgraded(&self) -> bool {
        self.phase() == Phase::Upgraded
    }

    /// The current phase's deadline and what it is called, if it has one.
    fn deadline(&self, t: &Timeouts) -> Option<(Instant, &'static str)> {
        match self.phase() {
            Phase::Fresh | Phase::Head => Some((self.since() + t.header_read, "header_timeout")),
            Phase::Idle => Some((self.since() + t.idle, "idle_timeout")),
            Phase::Busy | Phase::Upgraded => None,
        }
    }
}

/// The connection timeouts, from `[http]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub header_read: Duration,
    pub idle: Duration,
}

impl Timeouts {
    pub fn from_config(h: &HttpConfig) -> Timeouts {
        Timeouts { header_read: h.header_read_timeout, idle: h.keep_alive_timeout }
    }
}

/// Resolves when the connection's phase deadline passes, with the reason.
async fn watchdog(conn: &Conn, t: &Timeouts) -> &'static str {
    loop {
        match conn.deadline(t) {
            Some((at, reason)) if Instant::now() >= at => return reason,
            Some((at, _)) => tokio::time::sleep_until(at).await,
            // Upgraded (or streaming) for good: nothing left to enforce, and
            // no timer per session.
            None if conn.upgraded() => std::future::pending().await,
            // Busy: nothing to enforce now; look again later.
            None => tokio::time::sleep(t.header_read).await,
        }
    }
}

/// The open HTTP connections, in accept order, and their cap.
pub(crate) struct Connections {
    cap: usize,
    open: Mutex<BTreeMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
    epoch: Instant,
    metrics: Arc<Metrics>,
}

impl Connections {
    pub fn new(cap: usize, metrics: Arc<Metrics>) -> Connections {
        Connections {
            cap,
            open: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(1),
            epoch: Instant::now(),
            metrics,
        }
    }

    /// A place for a new connection, evicting another at the cap; `None`
    /// when every place holds a request in progress.
    fn admit(self: &Arc<Self>) -> Option<Arc<Conn>> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn::new(id, self.epoch, Arc::downgrade(self)));
        let mut open = self.open.lock().expect("connection registry lock");
        if open.len() >= self.cap {
            let Some(victim) = victim(&open) else {
                self.metrics.http_dropped("rejected");
                return None;
            };
            let victim = open.remove(&victim).expect("victim is registered");
            victim.evicted.cancel();
            self.metrics.http_dropped("evicted");
        }
        open.insert(conn.id, conn.clone());
        self.metrics.http_connections.set(i64::try_from(open.len()).unwrap_or(i64::MAX));
        self.metrics.http_connections_opened.inc();
        Some(conn)
    }

    fn release(&self, id: u64) {
        let mut open = self.open.lock().expect("connection registry lock");
        open.remove(&id);
        self.metrics.http_connections.set(i64::try_from(open.len()).unwrap_or(i64::MAX));
    }
}

/// The connection to evict: the oldest that never had a request dispatched
/// and is not busy, else the oldest that is between requests.
fn victim(open: &BTreeMap<u64, Arc<Conn>>) -> Option<u64> {
    let mut idle = None;
    for (id, c) in open {
        match c.phase() {
            Phase::Fresh | Phase::Head if !c.served.load(Ordering::Acquire) => return Some(*id),
            Phase::Fresh | Phase::Head | Phase::Idle => {
                idle.get_or_insert(*id);
            }
            Phase::Busy | Phase::Upgraded => {}
        }
    }
    idle
}

/// Removes the connection from the registry on every exit path of its task.
struct Registered(Arc<Connections>, u64);

impl Drop for Registered {
    fn drop(&mut self) {
        self.0.release(self.1);
    }
}

/// What serves each request: the router inside the response-header layers
/// and the body guard (`Server::http_service`), cloned per request without
/// an allocation (each layer holds `Arc`s and static header values).
pub(crate) type HttpService =
    SetResponseHeader<SetResponseHeader<body::Guard<Router>, HeaderValue>, HeaderValue>;

/// The service as a hyper service that tells the connection when a request
/// is dispatched and when it is answered.
#[derive(Clone)]
struct Tracked {
    inner: TowerToHyperService<HttpService>,
    conn: Arc<Conn>,
}

impl hyper::service::Service<Request<Incoming>> for Tracked {
    type Response = Response<axum::body::Body>;
    type Error = Infallible;
    type Future = TrackedResponse;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        self.conn.begin_request();
        TrackedResponse { answer: self.inner.call(req), conn: Some(self.conn.clone()) }
    }
}

pin_project_lite::pin_project! {
    /// A request's answer; tells the connection once it is there.
    struct TrackedResponse {
        #[pin]
        answer: TowerToHyperServiceFuture<HttpService, Request<Incoming>>,
        conn: Option<Arc<Conn>>,
    }
}

impl Future for TrackedResponse {
    type Output = Result<Response<axum::body::Body>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let this = self.project();
        let mut resp = std::task::ready!(this.answer.poll(cx))?;
        if let Some(conn) = this.conn.take() {
            if resp.extensions().get::<Streaming>().is_some() {
                resp = conn.start_stream(resp);
            } else {
                conn.end_request(resp.status() == StatusCode::SWITCHING_PROTOCOLS);
            }
        }
        std::task::Poll::Ready(Ok(resp))
    }
}

pin_project_lite::pin_project! {
    /// An HTTP/2 stream's body: its request is in flight until it is dropped.
    struct InFlight {
        #[pin]
        inner: axum::body::Body,
        conn: Arc<Conn>,
    }

    impl PinnedDrop for InFlight {
        fn drop(this: Pin<&mut Self>) {
            this.conn.end_request(false);
        }
    }
}

impl http_body::Body for InFlight {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, axum::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

/// HTTP/2's connection preface: a client with prior knowledge opens with it.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The first bytes of a connection, read to tell HTTP/2 from HTTP/1.1:
/// up to the preface's length, stopping at the first byte that differs
/// from it (one read for an HTTP/1.1 request, whose first bytes differ).
/// `true` with the preface whole; the bytes read either way.
async fn sniff(stream: &mut TcpStream) -> std::io::Result<(bool, Vec<u8>)> {
    let mut buf = vec![0; H2_PREFACE.len()];
    let mut n = 0;
    while n < buf.len() {
        let got = stream.read(&mut buf[n..]).await?;
        if got == 0 {
            break;
        }
        n += got;
        if buf[..n] != H2_PREFACE[..n] {
            break;
        }
    }
    buf.truncate(n);
    Ok((n == H2_PREFACE.len() && buf == H2_PREFACE[..], buf))
}

/// The socket as hyper reads it.
type Io = TokioIo<io::GuardedIo<TcpStream>>;

/// A connection served by hyper, as either protocol: run to its end, or
/// asked to finish what is in flight and close.
trait Served: Future<Output = hyper::Result<()>> {
    fn graceful_shutdown(self: Pin<&mut Self>);
}

impl Served for http1::UpgradeableConnection<Io, Tracked> {
    fn graceful_shutdown(self: Pin<&mut Self>) {
        http1::UpgradeableConnection::graceful_shutdown(self);
    }
}

impl Served for http2::Connection<Io, Tracked, TokioExecutor> {
    fn graceful_shutdown(self: Pin<&mut Self>) {
        http2::Connection::graceful_shutdown(self);
    }
}

/// What every connection task needs, built once by the accept loop.
pub(crate) struct Serving {
    pub connections: Arc<Connections>,
    pub http: http1::Builder,
    /// `None` when `http.http2` is off: every connection is HTTP/1.1.
    pub http2: Option<http2::Builder<TokioExecutor>>,
    pub service: HttpService,
    pub timeouts: Timeouts,
    pub shutdown: CancellationToken,
    pub metrics: Arc<Metrics>,
    pub tasks: TaskTracker,
}

impl Serving {
    /// The hyper HTTP/1.1 settings.
    pub fn http_builder(config: &HttpConfig) -> http1::Builder {
        let mut http = http1::Builder::new();
        // No timer: heads are timed by the watchdog (module docs).
        http.max_header_size(config.max_header_bytes);
        http
    }

    /// The hyper HTTP/2 settings, if `http.http2` is on.
    pub fn http2_builder(config: &HttpConfig) -> Option<http2::Builder<TokioExecutor>> {
        if !config.http2 {
            return None;
        }
        let mut http = http2::Builder::new(TokioExecutor::new());
        http.max_concurrent_streams(config.http2_max_concurrent_streams)
            .max_header_list_size(u32::try_from(config.max_header_bytes).unwrap_or(u32::MAX));
        Some(http)
    }

    /// Take an accepted socket: find it a place under the cap (or close it)
    /// and serve it in its own task.
    pub fn serve(&self, mut stream: TcpStream) {
        let Some(conn) = self.connections.admit() else {
            // Every place holds a request in progress: closing is all that
            // keeps descriptors for the requests being served.
            drop(stream);
            return;
        };
        let _ = stream.set_nodelay(true);
        let service = Tracked { inner: TowerToHyperService::new(self.service.clone()), conn: conn.clone() };
        let registered = Registered(self.connections.clone(), conn.id);
        let (http1, http2) = (self.http.clone(), self.http2.clone());
        let (timeouts, shutdown, metrics) = (self.timeouts, self.shutdown.clone(), self.metrics.clone());
        self.tasks.spawn(async move {
            let _registered = registered;
            let closed = async {
                tokio::select! {
                    reason = watchdog(&conn, &timeouts) => Some(reason),
                    // Counted by the acceptor that evicted it.
                    () = conn.evicted.cancelled() => None,
                }
            };
            tokio::pin!(closed);
            let (h2, read) = match &http2 {
                None => (false, Vec::new()),
                Some(_) => tokio::select! {
                    sniffed = sniff(&mut stream) => match sniffed {
                        Ok(sniffed) => sniffed,
                        Err(e) => {
                            tracing::debug!(error = %e, "http connection ended before a request");
                            return;
                        }
                    },
                    reason = &mut closed => return dropped(&metrics, reason),
                    () = shutdown.cancelled() => return,
                },
            };
            if !read.is_empty() {
                conn.on_read();
            }
            let io = TokioIo::new(io::GuardedIo::with_prefix(stream, conn.clone(), read.into()));
            let result = match http2 {
                Some(http2) if h2 => {
                    conn.multiplexed.store(true, Ordering::Release);
                    drive(http2.serve_connection(io, service), closed, &shutdown).await
                }
                _ => drive(http1.serve_connection(io, service).with_upgrades(), closed, &shutdown).await,
            };
            match result {
                Err(reason) => dropped(&metrics, reason),
                Ok(Err(e)) => tracing::debug!(error = %e, "http connection ended with an error"),
                Ok(Ok(())) => {}
            }
        });
    }
}

/// Serve `http` until it ends, the connection is `closed` (`Err` with the
/// reason), or the server shuts down: then the request in progress is
/// finished and the connection closed, a connection that never completes
/// one still bounded by `closed`.
async fn drive(
    http: impl Served,
    mut closed: Pin<&mut impl Future<Output = Option<&'static str>>>,
    shutdown: &CancellationToken,
) -> Result<hyper::Result<()>, Option<&'static str>> {
    tokio::pin!(http);
    tokio::select! {
        r = http.as_mut() => Ok(r),
        reason = &mut closed => Err(reason),
        () = shutdown.cancelled() => {
            http.as_mut().graceful_shutdown();
            tokio::select! {
                r = http.as_mut() => Ok(r),
                reason = &mut closed => Err(reason),
            }
        }
    }
}

fn dropped(metrics: &Metrics, reason: Option<&'static str>) {
    if let Some(reason) = reason {
        tracing::debug!(reason, "closing an http connection");
        metrics.http_dropped(reason);
    }
}
