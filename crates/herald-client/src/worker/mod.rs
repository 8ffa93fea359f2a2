//! The background task of a [`crate::Client`]: owns the socket and all
//! subscription state, reconnects, resumes, dedups.
//!
//! Shape: `run` loops connect → session → backoff. While offline it keeps
//! serving commands (subscriptions are recorded, publishes queued). A
//! session first re-subscribes every channel with `since` = its resume point, then
//! loops over a biased `select!` of commands, the next frame, and an idle
//! timer that probes a silent connection with a ping.
//!
//! Cleanup (failing waiters, ending subscriptions, publishing the fatal
//! error) happens in exactly one place, at the end of `run`.
//!
//! Code map: this file holds the connection loop (connect, session,
//! backoff, shutdown); [`offline`] serves handles between connections
//! (subscriptions recorded, publishes buffered); [`requests`] encodes
//! requests and dispatches replies and control frames; [`queue`] is the
//! per-subscription queue (dedup against the resume position, hand-over,
//! backpressure). The handles (`client.rs`) and the worker share only
//! `command.rs` and `event.rs`.

mod offline;
mod queue;
mod requests;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use herald_proto::close;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use self::queue::Sub;
use self::requests::Pending;
use crate::command::{Command, PublishCmd, ServerSubscribed, Shared};
use crate::event::{ClientStatus, ConnState};
use crate::options::ClientOptions;
use crate::{ClientError, ConnectOptions, Connection, ServerEvent};

/// How long a graceful close waits for the server's close frame.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

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
    /// Where server-made subscriptions go (`server_subscriptions` on).
    server_subs: Option<mpsc::Sender<ServerSubscribed>>,
}

impl Worker {
    pub(crate) fn new(
        opts: ClientOptions,
        cmd_rx: mpsc::Receiver<Command>,
        shared: Arc<Shared>,
        status_tx: watch::Sender<ClientStatus>,
        server_subs: Option<mpsc::Sender<ServerSubscribed>>,
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
            server_subs,
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
            // A draining node sends its clients elsewhere: at once, no backoff.
            let drained = matches!(&error, ClientError::Closed { code: Some(close::DRAINING), .. });
            if drained {
                attempt = 0;
            }
            let delay =
                if drained { Duration::ZERO } else { self.opts.backoff.delay(attempt, &mut self.rng) };
            attempt = attempt.saturating_add(1);
            tracing::debug!(error = %error, ?delay, attempt, "herald client reconnecting");
            if let Err(done) = self.while_offline(Box::pin(tokio::time::sleep(delay))).await {
                return Exit::Shutdown(done);
            }
        }
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
    /// resume point, then send the publishes that waited for a connection.
    async fn resume_all(&mut self, conn: &mut Connection) -> Result<(), ClientError> {
        // Subscriptions whose caller went away are not resumed.
        self.subs
            .retain(|_, s| !s.events_tx.is_closed() && !s.initial.as_ref().is_some_and(|i| i.is_closed()));
        // The server makes its own again (a `subscribed` frame).
        let channels: Vec<Box<str>> =
            self.subs.iter().filter(|(_, s)| !s.server_side).map(|(c, _)| c.clone()).collect();
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

    fn set_state(&mut self, state: ConnState) {
        let status = ClientStatus { state, connects: self.connects };
        self.status_tx.send_if_modified(|s| {
            let changed = *s != status;
            *s = status;
            changed
        });
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
        Some(
            c @ (close::BAD_REQUEST
            | close::UNAUTHORIZED
            | close::TOKEN_EXPIRED
            | close::DISCONNECTED_FOR_GOOD),
        ) => Err(ClientError::Disconnected { code: c, reason }),
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
            None,
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
