//! One WebSocket connection: a single task owns the socket and all session
//! state, looping over a biased `select!` of shutdown, slow-consumer kick,
//! outbox, inbound frames, catch-up work and the heartbeat tick. The same
//! session serves every wire (`gateway::wire`) without asking which: the
//! wire decodes each read frame into commands, applied at one place
//! ([`Session::apply`]), and encodes everything the session sends.
//!
//! Delivery per durable subscription is decided by the pure state machine
//! `herald_core::delivery` (frames in seq order, each seq once, no gap; the
//! catch-up/live seam; gap and epoch checks; the acked window): this task
//! feeds it live messages, log pages, acks and timer firings, and does what
//! it says. The hub registration happens before the first position read, so
//! nothing committed after it can be missed.
//!
//! Presence: a subscription of a presence channel holds a member lease
//! (`rooms::MemberLease`), renewed on every tick. A clean end of the connection
//! (the peer's close frame, a kick, shutdown) or an unsubscribe leaves at
//! once; any other end (network loss, I/O error, idle timeout, a panic)
//! leaves the lease to expire, so a client back within the lease keeps its
//! membership without a leave/join pair. A lease found gone at a renewal
//! (it expired while this node was paused or cut off from its engine)
//! lapses: it is asked back with its fencing token only after the peer
//! answers a ping sent after that renewal (`session/liveness.rs`), so a
//! connection that closed or went silent meanwhile brings back no ghost.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use herald_core::delivery::AckStep;
use herald_core::Seq;
use herald_proto::{close, ChannelName};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::time::Sleep;
use tokio_websockets::{CloseCode, Message as WsMessage, WebSocketStream};

use crate::auth::Identity;
use crate::error::ApiError;
use crate::hub::{Charge, ConnHandle, Mailbox, Outgoing, Stop};
use crate::state::AppState;

mod apply;
mod budget;
mod centrifugo;
mod channels;
mod control;
mod deliver;
mod liveness;
mod pipeline;
mod presence;
mod read_gate;
mod requests;
mod server_side;
mod socket;
mod sse;
mod subs;

use channels::{ChannelTimers, Channels, LogDelivery, Registrations, Sub, Timers};

pub type Ws = WebSocketStream<TokioIo<Upgraded>>;

pub use crate::gateway::wire::Wire;
pub(crate) use control::admit;
pub(crate) use presence::new_client_id;
pub use socket::{sse_pipe, Socket};

// Handler futures are boxed where they are awaited: an async state machine
// reserves room for its largest nested future, and every connection's task
// holds one, so an idle session would otherwise carry the publish path's
// state (kilobytes) while it waits. Boxing costs one short-lived allocation
// per handled frame or outbox batch.

/// How long to wait for the peer's close frame after sending ours.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Whatever way the session ends, its outbox takes nothing more and lets go
/// of what it still holds (and its share of the server's ceiling) at once;
/// the hub entries go with `regs`.
impl Drop for Session {
    fn drop(&mut self) {
        self.handle.mailbox.close_outbox();
        self.state.sessions.remove(self.handle.id);
    }
}

/// Why the loop ended.
enum SessionEnd {
    /// The peer closed or the socket failed: nothing more to send.
    Gone,
    /// We close with this code and reason.
    Close { code: u16, reason: &'static str, reconnect: bool },
    /// The backend closes the connection (`control.rs`).
    Backend(crate::hub::Closing),
}

pub struct Session {
    state: Arc<AppState>,
    identity: Identity,
    /// Its read side is polled only once it signalled (`session/read_gate.rs`).
    ws: Socket,
    handle: ConnHandle,
    /// The subscriptions, their delivery and catch-up.
    chans: Channels,
    /// What the write path holds until its flush (`session/deliver.rs`).
    held: Held,
    last_rx: Instant,
    /// Numbered pings and their echoes (presence rejoins wait for one).
    liveness: liveness::Liveness,
    budget: budget::Budget,
    /// Publishes read and not answered yet (`session/pipeline.rs`).
    pipeline: pipeline::Pipeline,
    /// The protocol spoken on this socket (`gateway::wire`).
    wire: Wire,
    /// The client's address as the proxy in front reports it.
    remote: Option<Arc<str>>,
}

/// What this session holds in its write path, counted in its byte bound
/// (`bytes`, in `handle.mailbox`) and the server's (`batch` keeps the
/// outbox entries, `page` the catch-up page's charge) until the flush that
/// writes it: a session blocked on a full socket keeps counting what it
/// holds.
struct Held {
    batch: Vec<Arc<Outgoing>>,
    page: Option<Charge>,
    bytes: usize,
    /// Average frame size of the last catch-up page (pessimistic at first).
    frame_estimate: usize,
}

impl Session {
    /// Build the session for an upgraded socket. Synchronous on purpose: the
    /// connection task then holds the `Session` once, not also the pieces it
    /// was made from (an async fn keeps its arguments alive in its future).
    pub fn new(
        state: Arc<AppState>,
        ws: Socket,
        identity: Identity,
        conn_id: u64,
        wire: Wire,
        remote: Option<Arc<str>>,
    ) -> Self {
        let mailbox = Arc::new(Mailbox::new(state.config().websocket.outbox_capacity));
        state.sessions.add(conn_id, &mailbox);
        let handle = ConnHandle { id: conn_id, mailbox };
        state.metrics.connections.inc();
        state.metrics.connections_total.inc();
        let protocol = wire.protocol();
        state.metrics.protocol_connection(protocol, 1);
        let budget = budget::Budget::new(&state.config().rate_limits, Instant::now());
        let frame_estimate = state.config().websocket.max_message_bytes;
        Session {
            chans: Channels {
                regs: Registrations {
                    state: state.clone(),
                    conn_id,
                    subs: subs::SubMap::default(),
                    leave_on_drop: false,
                    protocol,
                },
                timers: None,
                catchup: VecDeque::new(),
                pause: None,
            },
            held: Held { batch: Vec::new(), page: None, bytes: 0, frame_estimate },
            state,
            identity,
            ws,
            handle,
            last_rx: Instant::now(),
            liveness: liveness::Liveness::default(),
            budget,
            pipeline: pipeline::Pipeline::default(),
            wire,
            remote,
        }
    }

    /// Run the connection to its end. Cleanup is guaranteed by `Registrations`.
    ///
    /// Not an `async fn`: one taking `mut self` keeps the session twice in
    /// its future (the argument and the mutable binding), about 700 bytes
    /// more in every connection's task; an `async move` block uses the
    /// captured session in place.
    #[allow(clippy::manual_async_fn)]
    pub fn run(mut self) -> impl Future<Output = ()> + Send {
        async move {
            let end = self.run_loop().await;
            if let SessionEnd::Close { code, .. } = &end {
                // An idle timeout is a lost client, like a dropped socket.
                self.chans.regs.leave_on_drop |= *code != close::IDLE_TIMEOUT;
                self.state.metrics.closed(*code);
            }
            match end {
                SessionEnd::Close { code, reason, reconnect } => {
                    Box::pin(self.close(code, reason, reconnect)).await;
                }
                SessionEnd::Backend(c) => {
                    // The backend's close is a clean end: presence is left now.
                    self.chans.regs.leave_on_drop = true;
                    self.state.metrics.closed(c.code);
                    Box::pin(self.close(c.code, &c.reason, c.reconnect)).await;
                }
                SessionEnd::Gone => {}
            }
            tracing::debug!(conn = self.handle.id, "connection ended");
        }
    }

    async fn run_loop(&mut self) -> SessionEnd {
        if self.wire.starts_personal() {
            self.register();
            if let Err(end) = Box::pin(self.start_personal()).await {
                return end;
            }
        }
        // What the session queued before it ran (an SSE stream's opening).
        if self.ws.flush().await.is_err() {
            return SessionEnd::Gone;
        }
        let mut period = self.tick_period();
        let mut tick = heartbeat(period);
        let mut expiry = self.expiry_timer();
        let stops = self.handle.mailbox.clone();
        loop {
            let has_catchup = !self.chans.catchup.is_empty();
            // Back-pressure: with the pipeline full, the socket is not read.
            let may_read = self.may_read();
            let step = async {
                tokio::select! {
                    biased;
                    msg = std::future::poll_fn(|cx| self.handle.mailbox.poll_pop(cx)) => Box::pin(self.on_outbox(msg)).await,
                    answers = std::future::poll_fn(|cx| pipeline::poll_in_engine(&mut self.pipeline, cx)) => {
                        Box::pin(self.on_answers(answers)).await
                    }
                    frame = std::future::poll_fn(|_| read_gate::poll_next(&self.handle.mailbox, &mut self.ws)), if may_read => {
                        Box::pin(self.on_frames(frame)).await
                    }
                    () = std::future::poll_fn(|cx| poll_pause(&mut self.chans.pause, cx)), if has_catchup => {
                        Box::pin(self.catchup_step()).await
                    }
                    Some(expired) = std::future::poll_fn(|cx| poll_timer(&mut self.chans.timers, cx)) => {
                        Box::pin(self.on_timer(expired)).await
                    }
                    order = std::future::poll_fn(|cx| self.handle.mailbox.poll_order(cx)) => {
                        Box::pin(self.on_order(order)).await
                    }
                    _ = tick.tick() => Box::pin(self.on_tick()).await,
                }
            };
            // Shutdown and the kick also interrupt a step blocked on a full
            // socket, so a peer that stops reading cannot pin the task.
            let result = tokio::select! {
                biased;
                stop = std::future::poll_fn(|cx| stops.poll_stop(cx)) => Err(match stop {
                    Stop::Shutdown => SessionEnd::Close {
                        code: close::GOING_AWAY,
                        reason: "server shutting down",
                        reconnect: true,
                    },
                    Stop::SlowConsumer => {
                        self.state.metrics.slow_consumers.inc();
                        SessionEnd::Close { code: close::SLOW_CONSUMER, reason: "slow consumer", reconnect: true }
                    }
                    Stop::Drain => SessionEnd::Close {
                        code: close::DRAINING,
                        reason: "node draining: reconnect elsewhere",
                        reconnect: true,
                    },
                    Stop::Backend => match self.handle.mailbox.closing() {
                        Some(c) => SessionEnd::Backend(c),
                        None => SessionEnd::Gone,
                    },
                }),
                () = std::future::poll_fn(|cx| poll_deadline(&mut expiry, cx)) => Err(SessionEnd::Close {
                    code: close::TOKEN_EXPIRED,
                    reason: "token expired",
                    reconnect: true,
                }),
                r = step => r,
            };
            if let Err(end) = result {
                return end;
            }
            // `connect` and `refresh` (Centrifugo) change the identity.
            if self.wire.take_identity_changed() {
                expiry = self.expiry_timer();
            }
            // Subscribing to or leaving a presence channel changes the period.
            let want = self.tick_period();
            if want != period {
                period = want;
                tick = heartbeat(period);
            }
        }
    }

    /// The heartbeat period: `heartbeat.ping_interval`, or the presence renew
    /// period while this connection holds a member lease (so connections
    /// without presence wake up only every `heartbeat.ping_interval`).
    fn tick_period(&self) -> Duration {
        if self.chans.regs.subs.values().any(|s| s.presence.is_some()) {
            self.state.presence_tick
        } else {
            self.state.config().heartbeat.ping_interval
        }
    }

    /// Fires at the token's `exp` plus `jwt.leeway_secs` (plus
    /// `jwt.refresh_grace` where the peer can refresh on the socket): the
    /// connection closes with 4003 then, not at the next tick.
    fn expiry_timer(&self) -> Option<Pin<Box<Sleep>>> {
        let exp = self.identity.exp?;
        let jwt = &self.state.config().jwt;
        let grace = if self.wire.refreshes_token() { jwt.refresh_grace } else { Duration::ZERO };
        let at = UNIX_EPOCH + Duration::from_secs(exp.saturating_add(jwt.leeway_secs)) + grace;
        let left = at.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO);
        Some(Box::pin(tokio::time::sleep(left)))
    }

    fn on_read_error(&self, e: tokio_websockets::Error) -> SessionEnd {
        match e {
            // tokio-websockets has already queued a 1009 close frame.
            tokio_websockets::Error::PayloadTooLong { .. } => SessionEnd::Close {
                code: close::MESSAGE_TOO_BIG,
                reason: "message too big",
                reconnect: false,
            },
            tokio_websockets::Error::Protocol(_) => {
                SessionEnd::Close { code: close::BAD_REQUEST, reason: "protocol violation", reconnect: false }
            }
            e => {
                tracing::debug!(conn = self.handle.id, error = %e, "socket read failed");
                SessionEnd::Gone
            }
        }
    }

    /// A frame read from the socket, then every further frame already
    /// there (while the pipeline has room), so that publishes that arrive
    /// together go to the engine as one batch.
    async fn on_frames(
        &mut self,
        mut frame: Option<Result<WsMessage, tokio_websockets::Error>>,
    ) -> Result<(), SessionEnd> {
        loop {
            match frame {
                None => return Err(SessionEnd::Gone),
                Some(Err(e)) => return Err(self.on_read_error(e)),
                Some(Ok(m)) => {
                    self.last_rx = Instant::now();
                    self.on_inbound(m).await?;
                }
            }
            if !self.may_read() {
                break;
            }
            match read_gate::try_next(&self.handle.mailbox, &mut self.ws) {
                Some(next) => frame = next,
                None => break,
            }
        }
        self.start_batch();
        Ok(())
    }

    async fn on_tick(&mut self) -> Result<(), SessionEnd> {
        let heartbeat = &self.state.config().heartbeat;
        if self.wire.reads() && self.last_rx.elapsed() >= heartbeat.idle_timeout {
            return Err(SessionEnd::Close {
                code: close::IDLE_TIMEOUT,
                reason: "idle timeout",
                reconnect: true,
            });
        }
        if self.chans.regs.subs.values().any(|s| s.presence.is_some()) {
            Box::pin(self.renew_presence()).await;
        }
        Box::pin(self.send_ping()).await
    }

    async fn on_inbound(&mut self, msg: WsMessage) -> Result<(), SessionEnd> {
        if msg.is_pong() {
            // A lapsed presence lease waits for this (see `renew_presence`).
            if self.liveness.on_pong(msg.as_payload()) && self.has_lapsed() {
                Box::pin(self.rejoin_lapsed()).await;
            }
            return Ok(());
        }
        if msg.is_ping() {
            return Ok(());
        }
        if msg.is_close() {
            // tokio-websockets answers the close; the next read ends the
            // loop. A close frame is a clean end: leave presence at once.
            self.chans.regs.leave_on_drop = true;
            // The publishes sent before the close still go to the engine
            // (their replies may no longer get through).
            return Box::pin(self.settle_publishes()).await;
        }
        // Not boxed: this runs inside `on_frames`, boxed where awaited.
        for command in self.wire.decode(&msg) {
            self.apply(command).await?;
        }
        Ok(())
    }

    /// The client ends a subscription; false if it had none.
    async fn unsubscribe(&mut self, channel: &ChannelName) -> bool {
        let Some(sub) = self.chans.regs.remove(channel) else { return false };
        if let Some(hold) = &sub.presence {
            Box::pin(crate::rooms::leave(&self.state, channel, hold)).await;
        }
        if let Some(mut log) = sub.log {
            log.delivery.end(&mut ChannelTimers { queue: &mut self.chans.timers, channel });
        }
        self.chans.catchup.retain(|c| c != channel);
        true
    }

    /// Take one frame of the budget (see `session/budget.rs`): false when
    /// refused (the caller answers `rate_limited`); the close once
    /// refusals go on.
    fn take_budget(&mut self) -> Result<bool, SessionEnd> {
        let now = Instant::now();
        let rate_limits = &self.state.config().rate_limits;
        if self.budget.take_frame(rate_limits, now) {
            return Ok(true);
        }
        self.state.metrics.frames_refused.inc();
        if self.budget.refuse(rate_limits, now) {
            return Err(SessionEnd::Close {
                code: close::RATE_LIMITED,
                reason: "rate limited",
                reconnect: true,
            });
        }
        Ok(false)
    }

    /// Whether an ack of `seq` on `channel` moves the subscription's acked
    /// window (a first ack of delivered messages).
    fn ack_moves(&self, channel: &ChannelName, seq: Seq) -> bool {
        self.chans
            .regs
            .subs
            .get(channel)
            .and_then(|s| s.log.as_ref())
            .is_some_and(|l| matches!(l.delivery.check_ack(seq), Ok(AckStep::Store { .. })))
    }

    /// An `error` reply, within `rate_limits.error_replies_per_sec`; beyond it
    /// the reply is dropped and counted.
    async fn send_error(
        &mut self,
        err: &ApiError,
        req: Option<u64>,
        channel: Option<&str>,
    ) -> Result<(), SessionEnd> {
        if !self.budget.take_error_reply(&self.state.config().rate_limits, Instant::now()) {
            self.state.metrics.error_replies_dropped.inc();
            return Ok(());
        }
        self.send_bytes(self.wire.error(err, req, channel)).await
    }

    async fn send_bytes(&mut self, bytes: Vec<u8>) -> Result<(), SessionEnd> {
        let frame = self.wire.frame(Bytes::from(bytes));
        self.ws.send(frame).await.map_err(|_| SessionEnd::Gone)
    }

    /// The heartbeat's ping, as the wire sends it.
    async fn send_ping(&mut self) -> Result<(), SessionEnd> {
        let payload = self.liveness.next_ping();
        let ping = self
            .wire
            .ping(payload, self.state.config().heartbeat.idle_timeout)
            .map_err(|reason| SessionEnd::Close { code: close::BAD_REQUEST, reason, reconnect: false })?;
        self.ws.send(ping).await.map_err(|_| SessionEnd::Gone)
    }

    /// Say why, close, and wait briefly for the peer's close so our last
    /// frames are not lost to a reset. Bounded: a peer that reads nothing
    /// (a slow consumer) cannot hold the task.
    async fn close(&mut self, code: u16, reason: &str, reconnect: bool) {
        let (frame, code) = self.wire.close(code, reason, reconnect);
        let frame = frame.map(|f| self.wire.frame(Bytes::from(f)));
        let close_code = CloseCode::try_from(code).unwrap_or(CloseCode::INTERNAL_SERVER_ERROR);
        let ws = &mut self.ws;
        let _ = tokio::time::timeout(CLOSE_WAIT, async {
            // After a protocol error or an oversize frame the library has
            // already queued its own close; these sends then fail harmlessly.
            if let Some(frame) = frame {
                let _ = ws.feed(frame).await;
            }
            let _ = ws.send(WsMessage::close(Some(close_code), reason)).await;
            while let Some(Ok(_)) = ws.next().await {}
        })
        .await;
    }
}

/// A tick every `period`, the first one `period` from now rounded up to a
/// process-wide grid of `period / HEARTBEAT_GRID` (at most that much later),
/// and the next ones on that grid. Connections' ticks then share instants:
/// the runtime wakes once for the many connections of a grid point (their
/// pings go out, and the pongs come back, together) instead of once per
/// connection, which is most of what an idle connection costs in CPU.
fn heartbeat(period: Duration) -> tokio::time::Interval {
    let first = tokio::time::Instant::now() + period;
    let mut tick = tokio::time::interval_at(on_grid(first, period / HEARTBEAT_GRID), period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tick
}

/// Grid points per heartbeat period (see `heartbeat`).
const HEARTBEAT_GRID: u32 = 25;

/// `at` rounded up to a multiple of `step` from one origin for the whole
/// process (a day before its first use, so every clock, tokio's paused test
/// clocks included, reads later than it; otherwise `at` as it is).
fn on_grid(at: tokio::time::Instant, step: Duration) -> tokio::time::Instant {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let origin = *ORIGIN.get_or_init(|| {
        let now = std::time::Instant::now();
        now.checked_sub(Duration::from_secs(86_400)).unwrap_or(now)
    });
    let origin = tokio::time::Instant::from_std(origin);
    let step = step.as_nanos().max(1);
    match at.checked_duration_since(origin) {
        Some(since) => {
            let rounded = since.as_nanos().div_ceil(step) * step;
            u64::try_from(rounded).map_or(at, |n| origin + Duration::from_nanos(n))
        }
        None => at,
    }
}

/// The next fired redelivery timer: pending while there is no timer queue;
/// `None` (the select branch is skipped) when the queue is empty. A plain
/// poll function, not an async fn, so the session's future stays small.
fn poll_timer(
    timers: &mut Timers,
    cx: &mut std::task::Context<'_>,
) -> std::task::Poll<Option<(ChannelName, Seq)>> {
    match timers {
        Some(q) => q.poll_expired(cx).map(|e| e.map(|e| e.into_inner())),
        None => std::task::Poll::Pending,
    }
}

/// The catch-up pause: ready when there is none, or once it is over.
fn poll_pause(pause: &mut Option<Pin<Box<Sleep>>>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
    match pause {
        Some(sleep) => {
            std::task::ready!(std::future::Future::poll(sleep.as_mut(), cx));
            *pause = None;
            std::task::Poll::Ready(())
        }
        None => std::task::Poll::Ready(()),
    }
}

/// A deadline that may not exist (then never ready).
fn poll_deadline(
    deadline: &mut Option<Pin<Box<Sleep>>>,
    cx: &mut std::task::Context<'_>,
) -> std::task::Poll<()> {
    match deadline {
        Some(sleep) => std::future::Future::poll(sleep.as_mut(), cx),
        None => std::task::Poll::Pending,
    }
}
