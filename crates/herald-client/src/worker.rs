//! The background task of a [`crate::Client`]: owns the socket and all
//! subscription state, reconnects, resumes, dedups.
//!
//! Shape: `run` loops connect → session → backoff. While offline it keeps
//! serving commands (subscriptions are recorded, publishes queued). A
//! session first re-subscribes every channel with `since` = its cursor, then
//! loops over a biased `select!` of commands, the next frame, and an idle
//! timer that probes a silent connection with a ping.
//!
//! Cleanup (failing waiters, ending subscriptions, publishing the fatal
//! error) happens in exactly one place, at the end of `run`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use herald_proto::{close, ChannelName, ErrorCode, MessageView, Meta};
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::client::{ClientStatus, ConnState, Delivery, Event, PublishReply, Shared, SubscribeInfo};
use crate::connection::{ChannelFrame, PublishFrame};
use crate::error::{parse_error_code, view_code};
use crate::resume::{Cursor, Subscribed, Verdict};
use crate::{ClientError, ClientOptions, ConnectOptions, Connection, ServerEvent};

/// How long a graceful close waits for the server's close frame.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// A request from a handle to the worker. The large variants are boxed:
/// the command queue allocates its slots up front, per client.
pub(crate) enum Command {
    Subscribe(Box<SubscribeCmd>),
    Unsubscribe { id: u64, channel: ChannelName },
    Publish(Box<PublishCmd>),
    Close { done: oneshot::Sender<()> },
}

pub(crate) struct SubscribeCmd {
    pub id: u64,
    pub channel: ChannelName,
    pub since: Option<(u64, String)>,
    pub events_tx: mpsc::Sender<Result<Event, ClientError>>,
    pub reply: oneshot::Sender<Result<SubscribeInfo, ClientError>>,
}

/// A publish request; also how it waits for a connection.
pub(crate) struct PublishCmd {
    pub channel: Box<str>,
    pub data: Box<RawValue>,
    pub meta: Option<Meta>,
    pub idempotency_key: Option<String>,
    pub reply: oneshot::Sender<Result<PublishReply, ClientError>>,
}

/// Events a subscription's queue could not take yet, in order. Empty
/// `rest`: the subscription's caller is gone.
struct Stalled {
    channel: String,
    rest: Vec<Result<Event, ClientError>>,
}

/// One wanted subscription. It stays in `subs` across reconnects until the
/// caller drops it or it fails for good.
struct Sub {
    id: u64,
    channel: ChannelName,
    events_tx: mpsc::Sender<Result<Event, ClientError>>,
    cursor: Cursor,
    /// The caller's `subscribe` is still waiting for the first reply.
    initial: Option<oneshot::Sender<Result<SubscribeInfo, ClientError>>>,
    /// The subscribe reply arrived on the current connection. Durable
    /// messages before it are leftovers of an earlier subscription to the
    /// same channel (the server sends `ok` before any message).
    confirmed: bool,
}

/// A request sent on the current connection, by `req`. Cleared when the
/// connection ends.
enum Pending {
    Subscribe { channel: ChannelName, id: u64 },
    Unsubscribe,
    Publish(oneshot::Sender<Result<PublishReply, ClientError>>),
}

/// Why a session ended.
enum SessionEnd {
    Shutdown(Option<oneshot::Sender<()>>),
    Fatal(ClientError),
    /// Reconnect. `healthy`: the session worked for a while, so the backoff
    /// starts over.
    Retry {
        error: ClientError,
        healthy: bool,
    },
}

/// Why `run` ended.
enum Exit {
    Shutdown(Option<oneshot::Sender<()>>),
    Fatal(ClientError),
}

/// A `disconnect` frame, remembered until the close that follows it.
struct Disconnect {
    code: u16,
    reason: String,
    reconnect: bool,
}

pub(crate) struct Worker {
    connect: Arc<ConnectOptions>,
    opts: ClientOptions,
    cmd_rx: mpsc::Receiver<Command>,
    /// Keyed by channel name; at most one subscription per channel.
    subs: HashMap<Box<str>, Sub>,
    pending: HashMap<u64, Pending>,
    /// Publishes waiting for a connection.
    queued: VecDeque<Box<PublishCmd>>,
    /// Monotonic over the client's life, so a late reply from an old
    /// connection can never match a new request.
    next_req: u64,
    rng: fastrand::Rng,
    shared: Arc<Shared>,
    status_tx: watch::Sender<ClientStatus>,
    connects: u64,
}

impl Worker {
    pub(crate) fn new(
        opts: ClientOptions,
        cmd_rx: mpsc::Receiver<Command>,
        shared: Arc<Shared>,
        status_tx: watch::Sender<ClientStatus>,
    ) -> Self {
        Self {
            connect: Arc::new(opts.connect.clone()),
            opts,
            cmd_rx,
            subs: HashMap::new(),
            pending: HashMap::new(),
            queued: VecDeque::new(),
            next_req: 1,
            rng: fastrand::Rng::new(),
            shared,
            status_tx,
            connects: 0,
        }
    }

    pub(crate) async fn run(mut self) {
        let exit = self.connect_loop().await;
        let (err, done) = match exit {
            Exit::Fatal(e) => {
                tracing::debug!(error = %e, "herald client gave up");
                // Published before the senders drop, so a handle that sees
                // its channel close always finds the reason.
                let _ = self.shared.fatal.set(e.clone());
                (e, None)
            }
            Exit::Shutdown(done) => (ClientError::Shutdown, done),
        };
        self.fail_pending(&err);
        for q in self.queued.drain(..) {
            let _ = q.reply.send(Err(err.clone()));
        }
        for (_, sub) in self.subs.drain() {
            if let Some(initial) = sub.initial {
                let _ = initial.send(Err(err.clone()));
            }
        }
        // Answer commands already queued so no caller waits for a timeout.
        self.cmd_rx.close();
        while let Ok(cmd) = self.cmd_rx.try_recv() {
            match cmd {
                Command::Subscribe(cmd) => {
                    let _ = cmd.reply.send(Err(err.clone()));
                }
                Command::Publish(cmd) => {
                    let _ = cmd.reply.send(Err(err.clone()));
                }
                Command::Close { done } => {
                    let _ = done.send(());
                }
                Command::Unsubscribe { .. } => {}
            }
        }
        self.set_state(ConnState::Closed);
        if let Some(done) = done {
            let _ = done.send(());
        }
    }

    async fn connect_loop(&mut self) -> Exit {
        let mut attempt: u32 = 0;
        loop {
            self.set_state(ConnState::Connecting);
            let opts = self.connect.clone();
            // Boxed so the task's own future stays small.
            let connecting = Box::pin(async move { Connection::connect(&opts).await });
            let error = match self.while_offline(connecting).await {
                Err(done) => return Exit::Shutdown(done),
                Ok(Ok(conn)) => {
                    self.connects += 1;
                    self.set_state(ConnState::Connected);
                    let end = self.session(conn).await;
                    self.fail_pending(&ClientError::ConnectionLost);
                    match end {
                        SessionEnd::Shutdown(done) => return Exit::Shutdown(done),
                        SessionEnd::Fatal(e) => return Exit::Fatal(e),
                        SessionEnd::Retry { error, healthy } => {
                            if healthy {
                                attempt = 0;
                            }
                            error
                        }
                    }
                }
                Ok(Err(e)) if !connect_error_is_retryable(&e) => return Exit::Fatal(e),
                Ok(Err(e)) => e,
            };
            if let Some(max) = self.opts.max_reconnect_attempts {
                if attempt >= max {
                    return Exit::Fatal(ClientError::ReconnectExhausted {
                        attempts: attempt,
                        last: Box::new(error),
                    });
                }
            }
            let delay = self.opts.backoff.delay(attempt, &mut self.rng);
            attempt = attempt.saturating_add(1);
            tracing::debug!(error = %error, ?delay, attempt, "herald client reconnecting");
            if let Err(done) = self.while_offline(Box::pin(tokio::time::sleep(delay))).await {
                return Exit::Shutdown(done);
            }
        }
    }

    /// Drive `fut` while serving commands. `Err` when the client is asked to
    /// shut down (with the waiter to notify, if any).
    async fn while_offline<F: std::future::Future + Unpin>(
        &mut self,
        mut fut: F,
    ) -> Result<F::Output, Option<oneshot::Sender<()>>> {
        loop {
            tokio::select! {
                biased;
                out = &mut fut => return Ok(out),
                cmd = self.cmd_rx.recv() => match cmd {
                    None => return Err(None),
                    Some(Command::Close { done }) => return Err(Some(done)),
                    Some(cmd) => self.on_command_offline(cmd),
                },
            }
        }
    }

    fn on_command_offline(&mut self, cmd: Command) {
        match cmd {
            Command::Subscribe(cmd) => {
                // Sent on the next connection, with everything else.
                self.add_sub(*cmd);
            }
            Command::Unsubscribe { id, channel } => {
                self.remove_sub(id, &channel);
            }
            Command::Publish(cmd) => {
                if self.queued.len() >= self.opts.command_capacity.max(1) {
                    let _ = cmd.reply.send(Err(ClientError::Backlog));
                } else {
                    self.queued.push_back(cmd);
                }
            }
            Command::Close { .. } => unreachable!("handled by the caller"),
        }
    }

    /// Record a subscription. `false` (and the caller told) when the
    /// channel already has a live one.
    fn add_sub(&mut self, cmd: SubscribeCmd) -> bool {
        let SubscribeCmd { id, channel, since, events_tx, reply } = cmd;
        if let Some(existing) = self.subs.get(channel.as_str()) {
            if !existing.events_tx.is_closed() {
                let _ = reply.send(Err(ClientError::AlreadySubscribed(channel.to_string())));
                return false;
            }
        }
        let sub = Sub {
            id,
            channel: channel.clone(),
            events_tx,
            cursor: Cursor::new(since),
            initial: Some(reply),
            confirmed: false,
        };
        self.subs.insert(channel.as_str().into(), sub);
        true
    }

    /// Forget a subscription if it is still the one with this id. Returns
    /// whether it was removed.
    fn remove_sub(&mut self, id: u64, channel: &ChannelName) -> bool {
        if self.subs.get(channel.as_str()).is_some_and(|s| s.id == id) {
            self.subs.remove(channel.as_str());
            return true;
        }
        false
    }

    async fn session(&mut self, mut conn: Connection) -> SessionEnd {
        let started = Instant::now();
        let healthy_after = healthy_after(&self.opts);
        // A frame arrived: the server accepted us and works.
        let mut healthy = false;
        let retry = |error, healthy: bool| SessionEnd::Retry {
            error,
            healthy: healthy || started.elapsed() >= healthy_after,
        };

        // Boxed, like every rare path below: this function's future is held
        // by every connection's task for the connection's whole life.
        if let Err(e) = Box::pin(self.resume_all(&mut conn)).await {
            return retry(e, false);
        }

        let mut disconnect: Option<Disconnect> = None;
        let mut ping_sent: Option<Instant> = None;
        let idle = tokio::time::sleep_until(conn.last_activity() + self.opts.ping_interval);
        tokio::pin!(idle);
        loop {
            tokio::select! {
                biased;
                cmd = self.cmd_rx.recv() => match cmd {
                    None => {
                        Box::pin(close_gracefully(&mut conn)).await;
                        return SessionEnd::Shutdown(None);
                    }
                    Some(Command::Close { done }) => {
                        Box::pin(close_gracefully(&mut conn)).await;
                        return SessionEnd::Shutdown(Some(done));
                    }
                    Some(cmd) => {
                        if let Err(e) = Box::pin(self.on_command_online(&mut conn, cmd)).await {
                            return retry(e, healthy);
                        }
                    }
                },
                ev = conn.next_frame() => match ev {
                    Ok(Some(ServerEvent::Frame(view))) => {
                        healthy = true;
                        if view.kind == "message" || view.kind == "room" {
                            // The hot path is synchronous; only a full or
                            // abandoned queue needs the (boxed) slow path.
                            if let Some(stalled) = self.on_message(view) {
                                Box::pin(self.finish_delivery(&mut conn, stalled)).await;
                            }
                        } else if let Some(end) = Box::pin(self.on_frame(&mut conn, view, &mut disconnect)).await {
                            return end;
                        }
                    }
                    Ok(Some(ServerEvent::Closed { code, reason })) => {
                        return match on_closed(code, reason, disconnect.take()) {
                            Ok(error) => retry(error, healthy),
                            Err(fatal) => SessionEnd::Fatal(fatal),
                        };
                    }
                    Ok(None) => {
                        let error = ClientError::Closed { code: None, reason: "connection ended".into() };
                        return retry(error, healthy);
                    }
                    Err(e) => return retry(e, healthy),
                },
                () = &mut idle => {
                    // Any frame since our ping (pongs included) proves the
                    // connection alive.
                    let now = Instant::now();
                    let last = conn.last_activity();
                    if ping_sent.is_some_and(|sent| last >= sent) {
                        ping_sent = None;
                    }
                    match ping_sent {
                        Some(_) => return retry(ClientError::Timeout, healthy),
                        None if now >= last + self.opts.ping_interval => {
                            if let Err(e) = Box::pin(conn.send_ws_ping()).await {
                                return retry(e, healthy);
                            }
                            ping_sent = Some(now);
                            idle.as_mut().reset(now + self.opts.pong_timeout);
                        }
                        None => idle.as_mut().reset(last + self.opts.ping_interval),
                    }
                }
            }
        }
    }

    /// On a new connection: subscribe every wanted channel with its
    /// cursor, then send the publishes that waited for a connection.
    async fn resume_all(&mut self, conn: &mut Connection) -> Result<(), ClientError> {
        // Subscriptions whose caller went away are not resumed.
        self.subs
            .retain(|_, s| !s.events_tx.is_closed() && !s.initial.as_ref().is_some_and(|i| i.is_closed()));
        let channels: Vec<Box<str>> = self.subs.keys().cloned().collect();
        for channel in channels {
            self.send_subscribe(conn, &channel).await?;
        }
        while let Some(q) = self.queued.pop_front() {
            if q.reply.is_closed() {
                continue;
            }
            self.send_publish(conn, *q).await?;
        }
        Ok(())
    }

    async fn on_command_online(&mut self, conn: &mut Connection, cmd: Command) -> Result<(), ClientError> {
        match cmd {
            Command::Subscribe(cmd) => {
                let channel = cmd.channel.clone();
                if self.add_sub(*cmd) {
                    self.send_subscribe(conn, channel.as_str()).await?;
                }
            }
            Command::Unsubscribe { id, channel } => {
                if self.remove_sub(id, &channel) {
                    self.send_unsubscribe(conn, channel.as_str()).await?;
                }
            }
            Command::Publish(cmd) => self.send_publish(conn, *cmd).await?,
            Command::Close { .. } => unreachable!("handled by the caller"),
        }
        Ok(())
    }

    fn alloc_req(&mut self) -> u64 {
        let req = self.next_req;
        self.next_req += 1;
        req
    }

    async fn send_subscribe(&mut self, conn: &mut Connection, channel: &str) -> Result<(), ClientError> {
        let req = self.alloc_req();
        let Some(sub) = self.subs.get_mut(channel) else { return Ok(()) };
        sub.confirmed = false;
        let client_id = Some(self.opts.client_id.as_str());
        let frame = ChannelFrame { kind: "subscribe", req, channel, since: sub.cursor.since(), client_id };
        let text = serde_json::to_string(&frame).map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.pending.insert(req, Pending::Subscribe { channel: sub.channel.clone(), id: sub.id });
        conn.send_text(text).await
    }

    async fn send_unsubscribe(&mut self, conn: &mut Connection, channel: &str) -> Result<(), ClientError> {
        let req = self.alloc_req();
        let frame = ChannelFrame { kind: "unsubscribe", req, channel, since: None, client_id: None };
        let text = serde_json::to_string(&frame).map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.pending.insert(req, Pending::Unsubscribe);
        conn.send_text(text).await
    }

    async fn send_publish(&mut self, conn: &mut Connection, cmd: PublishCmd) -> Result<(), ClientError> {
        let PublishCmd { channel, data, meta, idempotency_key, reply } = cmd;
        let req = self.alloc_req();
        let frame = PublishFrame {
            kind: "publish",
            req,
            channel: &channel,
            data: &data,
            meta: meta.as_ref(),
            idempotency_key: idempotency_key.as_deref(),
        };
        let text = match serde_json::to_string(&frame) {
            Ok(t) => t,
            Err(e) => {
                let _ = reply.send(Err(ClientError::Config(format!("publish does not serialise: {e}"))));
                return Ok(());
            }
        };
        // Registered before sending: if the send fails, the session ends and
        // `fail_pending` answers it with `ConnectionLost` (it may have
        // reached the server).
        self.pending.insert(req, Pending::Publish(reply));
        conn.send_text(text).await
    }

    /// Handle one text frame. `Some` ends the session.
    async fn on_frame(
        &mut self,
        conn: &mut Connection,
        view: MessageView,
        disconnect: &mut Option<Disconnect>,
    ) -> Option<SessionEnd> {
        match view.kind.as_str() {
            "message" | "room" => {
                if let Some(stalled) = self.on_message(view) {
                    self.finish_delivery(conn, stalled).await;
                }
            }
            "ok" | "error" | "pong" => {
                let pending = view.req.and_then(|req| self.pending.remove(&req));
                match pending {
                    Some(Pending::Subscribe { channel, id }) => {
                        return self.on_subscribe_reply(conn, &channel, id, view).await;
                    }
                    Some(Pending::Publish(reply)) => {
                        let _ = reply.send(publish_reply(&view));
                    }
                    Some(Pending::Unsubscribe) => {}
                    None if view.kind == "error" => {
                        tracing::warn!(
                            code = ?view.code, message = ?view.message, channel = ?view.channel,
                            "herald server error not tied to a request"
                        );
                    }
                    None => {}
                }
            }
            "disconnect" => {
                *disconnect = Some(Disconnect {
                    code: view
                        .code
                        .as_ref()
                        .and_then(|c| c.as_u64())
                        .and_then(|c| u16::try_from(c).ok())
                        .unwrap_or(0),
                    reason: view.reason.unwrap_or_default(),
                    reconnect: view.reconnect.unwrap_or(true),
                });
            }
            "unsubscribed" => {
                if let Some(channel) = view.channel.as_deref().and_then(|c| ChannelName::new(c).ok()) {
                    let reason = view.reason.unwrap_or_default();
                    let ev = Event::Unsubscribed { channel: channel.clone(), reason };
                    self.deliver(conn, channel.as_str(), Ok(ev)).await;
                    // Not resumed on reconnect.
                    self.subs.remove(channel.as_str());
                }
            }
            // Frames this client does not use yet (presence join/leave, ...).
            _ => {}
        }
        None
    }

    /// Judge a `message` frame against its subscription's cursor and hand
    /// it over if the queue has room. `Some` when the rest needs
    /// [`Worker::finish_delivery`].
    fn on_message(&mut self, view: MessageView) -> Option<Stalled> {
        let kind = herald_proto::FrameKind::parse(&view.kind).unwrap_or_default();
        let MessageView { channel, seq, id, ts, data, meta, .. } = view;
        let channel = channel?;
        // No sub: left over from an unsubscribe still in flight.
        let sub = self.subs.get_mut(channel.as_str())?;
        if seq.is_some() && !sub.confirmed {
            // A durable message before the subscribe reply belongs to an
            // earlier subscription on this connection (see `Sub::confirmed`).
            return None;
        }
        let gap = match sub.cursor.on_message(seq) {
            Verdict::Duplicate => return None,
            Verdict::Deliver => None,
            Verdict::Gap { expected } => {
                let got = seq.unwrap_or(expected);
                tracing::warn!(channel = %sub.channel, expected, got, "herald delivery gap");
                Some(Event::Gap { channel: sub.channel.clone(), expected, got })
            }
        };
        let message = Event::Message(Delivery {
            channel: sub.channel.clone(),
            kind,
            seq,
            id: id.unwrap_or_default(),
            ts: ts.unwrap_or(0),
            data: data.unwrap_or_else(|| RawValue::NULL.to_owned()),
            meta,
        });
        self.offer(channel, gap.into_iter().chain(Some(message)).map(Ok))
    }

    /// Hand events to a subscription without waiting. `Some` when its
    /// queue is full (the rest, in order, must wait) or its caller is gone.
    fn offer(
        &mut self,
        channel: String,
        mut events: impl Iterator<Item = Result<Event, ClientError>>,
    ) -> Option<Stalled> {
        let sub = self.subs.get(channel.as_str())?;
        while let Some(ev) = events.next() {
            match sub.events_tx.try_send(ev) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(ev)) => {
                    let rest = std::iter::once(ev).chain(events).collect();
                    return Some(Stalled { channel, rest });
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    return Some(Stalled { channel, rest: Vec::new() });
                }
            }
        }
        None
    }

    /// Deliver what [`Worker::offer`] could not, waiting for room: a slow
    /// caller stalls the socket, which is the backpressure we want (the
    /// server disconnects a slow consumer and we resume from the cursor).
    /// A subscription whose caller is gone is dropped and unsubscribed. A
    /// closing client abandons the wait.
    async fn finish_delivery(&mut self, conn: &mut Connection, stalled: Stalled) {
        let Stalled { channel, rest } = stalled;
        let mut gone = rest.is_empty();
        for ev in rest {
            let Some(sub) = self.subs.get(channel.as_str()) else { return };
            match wait_for_room(&sub.events_tx, &self.shared, ev).await {
                Room::Sent => {}
                Room::Closing => return,
                Room::Gone => {
                    gone = true;
                    break;
                }
            }
        }
        if gone {
            self.subs.remove(channel.as_str());
            // A failed send ends the session on the next read anyway.
            let _ = self.send_unsubscribe(conn, &channel).await;
        }
    }

    /// Offer one event and wait for room if needed.
    async fn deliver(&mut self, conn: &mut Connection, channel: &str, ev: Result<Event, ClientError>) {
        if let Some(stalled) = self.offer(channel.to_owned(), std::iter::once(ev)) {
            self.finish_delivery(conn, stalled).await;
        }
    }

    async fn on_subscribe_reply(
        &mut self,
        conn: &mut Connection,
        channel: &ChannelName,
        id: u64,
        view: MessageView,
    ) -> Option<SessionEnd> {
        let Some(sub) = self.subs.get_mut(channel.as_str()).filter(|s| s.id == id) else {
            // Unsubscribed (or replaced) while the subscribe was in flight.
            if view.kind == "ok" {
                let _ = self.send_unsubscribe(conn, channel.as_str()).await;
            }
            return None;
        };
        if view.kind != "ok" {
            let error = ClientError::from_error_frame(&view);
            if let Some(initial) = sub.initial.take() {
                // The first subscribe fails straight to the caller.
                let _ = initial.send(Err(error));
                self.subs.remove(channel.as_str());
                return None;
            }
            if view_code(&view).as_deref().and_then(parse_error_code).is_some_and(is_transient) {
                // Resume later with the same cursor.
                return Some(SessionEnd::Retry { error, healthy: false });
            }
            tracing::debug!(%channel, %error, "herald resubscribe refused; ending the subscription");
            self.deliver(conn, channel.as_str(), Err(error)).await;
            self.subs.remove(channel.as_str());
            return None;
        }

        let reset = sub.cursor.on_subscribed(&Subscribed {
            epoch: view.epoch.as_deref(),
            first: view.first,
            head: view.head,
            truncated: view.truncated.unwrap_or(false),
            epoch_changed: view.epoch_changed.unwrap_or(false),
        });
        sub.confirmed = true;
        if let Some(initial) = sub.initial.take() {
            let info = SubscribeInfo {
                channel: channel.clone(),
                epoch: view.epoch.clone(),
                first: view.first,
                head: view.head,
                truncated: reset.truncated,
                epoch_changed: reset.epoch_changed,
            };
            if initial.send(Ok(info)).is_err() {
                // The caller stopped waiting (timeout or cancel).
                self.subs.remove(channel.as_str());
                let _ = self.send_unsubscribe(conn, channel.as_str()).await;
                return None;
            }
        }
        if reset.any() {
            let ev = Event::Reset {
                channel: channel.clone(),
                truncated: reset.truncated,
                epoch_changed: reset.epoch_changed,
                epoch: view.epoch.unwrap_or_default(),
                first: view.first.unwrap_or(0),
                head: view.head.unwrap_or(0),
            };
            self.deliver(conn, channel.as_str(), Ok(ev)).await;
        }
        None
    }

    /// Answer requests of the ended connection. Subscribes are not lost:
    /// they stay in `subs` and are sent again on the next connection.
    fn fail_pending(&mut self, err: &ClientError) {
        for (_, p) in self.pending.drain() {
            if let Pending::Publish(reply) = p {
                let _ = reply.send(Err(err.clone()));
            }
        }
    }

    fn set_state(&mut self, state: ConnState) {
        let status = ClientStatus { state, connects: self.connects };
        self.status_tx.send_if_modified(|s| {
            let changed = *s != status;
            *s = status;
            changed
        });
    }
}

/// Outcome of [`wait_for_room`].
enum Room {
    Sent,
    /// The subscription's receiver is gone.
    Gone,
    /// The client is closing; the event was dropped.
    Closing,
}

/// Wait until the subscription's queue has room, or the client closes.
async fn wait_for_room(
    tx: &mpsc::Sender<Result<Event, ClientError>>,
    shared: &Shared,
    ev: Result<Event, ClientError>,
) -> Room {
    // Created before the flag check so a close in between still wakes us.
    let closing = shared.closing_notify.notified();
    if shared.closing.load(Ordering::Acquire) {
        return Room::Closing;
    }
    tokio::select! {
        biased;
        permit = tx.reserve() => match permit {
            Ok(permit) => {
                permit.send(ev);
                Room::Sent
            }
            Err(_) => Room::Gone,
        },
        () = closing => Room::Closing,
    }
}

/// Close with 1000 and wait briefly for the server's close.
async fn close_gracefully(conn: &mut Connection) {
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, conn.close(Some(1000), "client closed")).await;
}

/// A session that lasted this long counts as healthy even if it received
/// nothing, so a long idle connection does not inherit old backoff.
fn healthy_after(opts: &ClientOptions) -> Duration {
    opts.backoff.max.max(opts.ping_interval)
}

fn publish_reply(view: &MessageView) -> Result<PublishReply, ClientError> {
    if view.kind != "ok" {
        return Err(ClientError::from_error_frame(view));
    }
    Ok(PublishReply {
        channel: view.channel.clone().unwrap_or_default(),
        seq: view.seq,
        id: view.id.clone().unwrap_or_default(),
        duplicate: view.duplicate.unwrap_or(false),
    })
}

/// Server-side conditions that pass: worth retrying the same request later.
fn is_transient(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::Unavailable
            | ErrorCode::ShuttingDown
            | ErrorCode::Internal
            | ErrorCode::RateLimited
            | ErrorCode::TooManyConnections
    )
}

/// Decide what a close means: `Ok(error)` to reconnect, `Err(fatal)` to
/// give up. A preceding `disconnect` frame decides; otherwise the close
/// code does (bad request, unauthorized and token expired would fail the
/// same way again with the same credentials).
fn on_closed(
    code: Option<u16>,
    reason: String,
    disconnect: Option<Disconnect>,
) -> Result<ClientError, ClientError> {
    if let Some(d) = disconnect {
        if d.reconnect {
            return Ok(ClientError::Closed { code: Some(d.code), reason: d.reason });
        }
        return Err(ClientError::Disconnected { code: d.code, reason: d.reason });
    }
    match code {
        Some(c @ (close::BAD_REQUEST | close::UNAUTHORIZED | close::TOKEN_EXPIRED)) => {
            Err(ClientError::Disconnected { code: c, reason })
        }
        _ => Ok(ClientError::Closed { code, reason }),
    }
}

/// Whether connecting again may succeed. Refusals for credentials or a
/// wrong address will not change by retrying; overload, shutdown and
/// network errors will.
fn connect_error_is_retryable(e: &ClientError) -> bool {
    match e {
        ClientError::Config(_) => false,
        ClientError::Rejected { status, .. } => !matches!(status, 400..=407 | 409..=428 | 430..=499),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_for_credentials_are_final_overload_is_not() {
        let rejected =
            |status| ClientError::Rejected { status, code: None, problem: None, body: String::new() };
        assert!(!connect_error_is_retryable(&rejected(401)));
        assert!(!connect_error_is_retryable(&rejected(403)));
        assert!(!connect_error_is_retryable(&rejected(404)));
        assert!(connect_error_is_retryable(&rejected(429)));
        assert!(connect_error_is_retryable(&rejected(503)));
        assert!(connect_error_is_retryable(&ClientError::Timeout));
    }

    /// A load generator holds ~15,000 clients: what each one keeps
    /// allocated must stay small. (Measured: ~3 KiB task, 32-byte commands;
    /// the bounds leave room for compiler changes, not for a new inline
    /// future in the session loop.)
    #[test]
    fn per_client_task_and_queue_slots_stay_small() {
        assert!(std::mem::size_of::<Command>() <= 32, "{}", std::mem::size_of::<Command>());
        let (_tx, rx) = mpsc::channel(1);
        let (status_tx, _) = watch::channel(ClientStatus { state: ConnState::Connecting, connects: 0 });
        let worker = Worker::new(
            ClientOptions::new(ConnectOptions::default()),
            rx,
            Arc::new(Shared::default()),
            status_tx,
        );
        let task = worker.run();
        assert!(std::mem::size_of_val(&task) <= 5 * 1024, "{}", std::mem::size_of_val(&task));
    }

    #[test]
    fn disconnect_frame_decides_over_close_code() {
        let d = |reconnect| Some(Disconnect { code: 4008, reason: "slow consumer".into(), reconnect });
        assert!(on_closed(Some(4008), "x".into(), d(true)).is_ok());
        assert!(matches!(
            on_closed(Some(4008), "x".into(), d(false)),
            Err(ClientError::Disconnected { code: 4008, .. })
        ));
        assert!(on_closed(Some(1001), "going away".into(), None).is_ok());
        assert!(on_closed(Some(4008), "slow".into(), None).is_ok());
        assert!(on_closed(None, String::new(), None).is_ok());
        assert!(on_closed(Some(4001), "unauthorized".into(), None).is_err());
        assert!(on_closed(Some(4003), "token expired".into(), None).is_err());
    }
}
