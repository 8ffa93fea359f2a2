//! [`Client`]: the resilient, high-level client. One background task per
//! client owns the socket (see `worker.rs`); the handles here only talk to
//! it over bounded channels.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use herald_proto::{ChannelName, Meta};
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot, watch, Notify};

use crate::backoff::Backoff;
use crate::worker::{Command, PublishCmd, SubscribeCmd, Worker};
use crate::{ClientError, ConnectOptions};

/// Settings of a [`Client`]. [`ClientOptions::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub connect: ConnectOptions,
    /// Reconnect delays (full jitter). Default 100 ms doubling up to 10 s.
    pub backoff: Backoff,
    /// Give up after this many consecutive failed reconnects (`None`:
    /// never). A connection that delivered anything resets the count.
    pub max_reconnect_attempts: Option<u32>,
    /// How long `subscribe` and `publish` wait for the server's reply
    /// (including waiting for a connection). Default 10 s.
    pub request_timeout: Duration,
    /// After this long without any frame from the server, send a WebSocket
    /// ping. Default 30 s.
    pub ping_interval: Duration,
    /// No frame at all within this long after our ping: the connection is
    /// dead; reconnect. Default 10 s.
    pub pong_timeout: Duration,
    /// Capacity of each subscription's event queue. When it is full the
    /// client stops reading the socket (the server then treats us as a slow
    /// consumer; we resume from the last delivered seq). Default 256.
    pub event_capacity: usize,
    /// Capacity of the command queue to the background task, which also
    /// bounds publishes waiting for a connection. Default 64.
    pub command_capacity: usize,
    /// This client's member id on presence channels, sent with every
    /// subscribe and kept across reconnects, so a reconnect within the
    /// server's lease keeps the membership (no leave/join pair). Default:
    /// random per `ClientOptions`.
    pub client_id: String,
}

impl ClientOptions {
    pub fn new(connect: ConnectOptions) -> Self {
        Self {
            connect,
            backoff: Backoff::default(),
            max_reconnect_attempts: None,
            request_timeout: Duration::from_secs(10),
            ping_interval: Duration::from_secs(30),
            pong_timeout: Duration::from_secs(10),
            event_capacity: 256,
            command_capacity: 64,
            client_id: format!("rc-{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..)),
        }
    }
}

impl From<ConnectOptions> for ClientOptions {
    fn from(connect: ConnectOptions) -> Self {
        Self::new(connect)
    }
}

/// One message delivered to a subscription.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub channel: ChannelName,
    /// `Message` for app messages; `Room` for a room's state changes, which
    /// share the channel's seqs.
    pub kind: herald_proto::FrameKind,
    /// `None` on volatile channels.
    pub seq: Option<u64>,
    pub id: String,
    /// Server time in ms since the Unix epoch.
    pub ts: u64,
    /// The published JSON, byte for byte as the server sent it.
    pub data: Box<RawValue>,
    pub meta: Option<Meta>,
}

impl Delivery {
    /// Deserialise `data`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.data.get())
    }
}

/// What a [`Subscription`] yields.
#[derive(Debug, Clone)]
pub enum Event {
    Message(Delivery),
    /// A subscribe reply (initial or on resume) reported that messages were
    /// skipped: `truncated` (retention removed some we had not seen) and/or
    /// `epoch_changed` (the channel's log was reset; seqs restart). Delivery
    /// continues from `first`. Whatever the caller derived from earlier
    /// messages may need a resync.
    Reset {
        channel: ChannelName,
        truncated: bool,
        epoch_changed: bool,
        epoch: String,
        first: u64,
        head: u64,
    },
    /// Seqs `expected..got` never arrived and no reset explained it. The
    /// server promises this does not happen; the client reports it rather
    /// than hide it, then delivers `got`.
    Gap {
        channel: ChannelName,
        expected: u64,
        got: u64,
    },
    /// The server ended the subscription (for example `room_closed`): it is
    /// not resumed, and nothing more comes.
    Unsubscribed {
        channel: ChannelName,
        reason: String,
    },
}

/// The server's reply to the initial subscribe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeInfo {
    pub channel: ChannelName,
    /// `None` (and `first`/`head` too) on volatile channels.
    pub epoch: Option<String>,
    pub first: Option<u64>,
    pub head: Option<u64>,
    pub truncated: bool,
    pub epoch_changed: bool,
}

/// The server's reply to a publish over the socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishReply {
    pub channel: String,
    /// `None` on volatile channels.
    pub seq: Option<u64>,
    pub id: String,
    /// The idempotency key matched an earlier publish; nothing was appended.
    pub duplicate: bool,
}

/// Connection state reported by [`Client::status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    Connecting,
    Connected,
    /// The client gave up or was closed; it will not reconnect.
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientStatus {
    pub state: ConnState,
    /// Successful connections so far (so `connects - 1` reconnects).
    pub connects: u64,
}

/// State shared by the handles and the worker.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// Set once, before the worker drops its senders, when the client gave
    /// up for good. Handles report it when their channel closes.
    pub fatal: OnceLock<ClientError>,
    pub next_sub_id: AtomicU64,
    /// [`Client::close`] was called. Lets the worker abandon a delivery
    /// blocked on a subscription nobody reads, so it gets to the `Close`
    /// command behind it.
    pub closing: AtomicBool,
    pub closing_notify: Notify,
}

impl Shared {
    fn closed_error(&self) -> ClientError {
        self.fatal.get().cloned().unwrap_or(ClientError::Shutdown)
    }
}

/// A resilient Herald client: one WebSocket connection, reconnected with
/// backoff, every subscription resumed from its last delivered seq.
///
/// Dropping the `Client` and every [`Subscription`] stops the background
/// task and closes the socket. [`Client::close`] does it explicitly.
#[derive(Debug)]
pub struct Client {
    cmd_tx: mpsc::Sender<Command>,
    shared: Arc<Shared>,
    status_rx: watch::Receiver<ClientStatus>,
    request_timeout: Duration,
    event_capacity: usize,
}

impl Client {
    /// Start the background task and begin connecting. Must be called inside
    /// a tokio runtime.
    pub fn new(opts: ClientOptions) -> Self {
        let (cmd_tx, cmd_rx) = mpsc::channel(opts.command_capacity.max(1));
        let (status_tx, status_rx) =
            watch::channel(ClientStatus { state: ConnState::Connecting, connects: 0 });
        let shared = Arc::new(Shared::default());
        let client = Self {
            cmd_tx,
            shared: shared.clone(),
            status_rx,
            request_timeout: opts.request_timeout,
            event_capacity: opts.event_capacity.max(1),
        };
        tokio::spawn(Worker::new(opts, cmd_rx, shared, status_tx).run());
        client
    }

    /// Subscribe to `channel`, optionally resuming after `since = (seq,
    /// epoch)`. Returns once the server accepted the subscription; its reply
    /// is [`Subscription::info`]. A refusal is [`ClientError::Server`] with the
    /// server's code (`forbidden`, `unknown_namespace`, ...).
    pub async fn subscribe(
        &self,
        channel: &str,
        since: Option<(u64, String)>,
    ) -> Result<Subscription, ClientError> {
        let channel = ChannelName::new(channel)
            .map_err(|e| ClientError::Config(format!("channel `{channel}`: {e}")))?;
        let (events_tx, events_rx) = mpsc::channel(self.event_capacity);
        let (reply_tx, reply_rx) = oneshot::channel();
        let id = self.shared.next_sub_id.fetch_add(1, Ordering::Relaxed);
        let cmd = Command::Subscribe(Box::new(SubscribeCmd {
            id,
            channel: channel.clone(),
            since,
            events_tx,
            reply: reply_tx,
        }));
        let info = self.call(cmd, reply_rx).await?;
        Ok(Subscription {
            id,
            channel,
            info,
            events_rx,
            cmd_tx: self.cmd_tx.clone(),
            shared: self.shared.clone(),
            done: false,
            unsubscribed: false,
        })
    }

    /// Publish over the socket (the namespace must allow client publishes).
    /// With an `idempotency_key`, retrying after [`ClientError::ConnectionLost`]
    /// or [`ClientError::Timeout`] is safe: the server returns the original
    /// result with `duplicate: true`.
    pub async fn publish(
        &self,
        channel: &str,
        data: &serde_json::Value,
        idempotency_key: Option<&str>,
    ) -> Result<PublishReply, ClientError> {
        let data = serde_json::value::to_raw_value(data)
            .map_err(|e| ClientError::Config(format!("data does not serialise: {e}")))?;
        self.publish_raw(channel, data, None, idempotency_key.map(str::to_owned)).await
    }

    /// [`Client::publish`] with raw JSON and `meta`.
    pub async fn publish_raw(
        &self,
        channel: &str,
        data: Box<RawValue>,
        meta: Option<Meta>,
        idempotency_key: Option<String>,
    ) -> Result<PublishReply, ClientError> {
        let (reply_tx, reply_rx) = oneshot::channel();
        let cmd = Command::Publish(Box::new(PublishCmd {
            channel: channel.into(),
            data,
            meta,
            idempotency_key,
            reply: reply_tx,
        }));
        self.call(cmd, reply_rx).await
    }

    /// The current connection state.
    pub fn status(&self) -> ClientStatus {
        *self.status_rx.borrow()
    }

    /// A receiver to wait on state changes, e.g.
    /// `rx.wait_for(|s| s.connects >= 2)`.
    pub fn watch_status(&self) -> watch::Receiver<ClientStatus> {
        self.status_rx.clone()
    }

    /// Close the socket (code 1000), end every subscription (their `next`
    /// returns `None`), and wait for the background task to finish.
    pub async fn close(&self) {
        self.shared.closing.store(true, Ordering::Release);
        self.shared.closing_notify.notify_waiters();
        let (done_tx, done_rx) = oneshot::channel();
        if self.cmd_tx.send(Command::Close { done: done_tx }).await.is_ok() {
            let _ = done_rx.await;
        }
    }

    /// Send a command and wait for its reply, both within the request
    /// timeout.
    async fn call<T>(
        &self,
        cmd: Command,
        reply_rx: oneshot::Receiver<Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        let exchange = async {
            self.cmd_tx.send(cmd).await.map_err(|_| self.shared.closed_error())?;
            reply_rx.await.map_err(|_| self.shared.closed_error())?
        };
        tokio::time::timeout(self.request_timeout, exchange).await.map_err(|_| ClientError::Timeout)?
    }
}

/// A live subscription. Yields [`Event`]s in seq order, without duplicates,
/// across reconnects. `next` returns `Some(Err(..))` once if the
/// subscription (or the whole client) failed for good, then `None`.
///
/// Dropping it unsubscribes.
#[derive(Debug)]
pub struct Subscription {
    id: u64,
    channel: ChannelName,
    info: SubscribeInfo,
    events_rx: mpsc::Receiver<Result<Event, ClientError>>,
    cmd_tx: mpsc::Sender<Command>,
    shared: Arc<Shared>,
    /// `None` was returned (or is about to be).
    done: bool,
    /// An unsubscribe command was already sent.
    unsubscribed: bool,
}

impl Subscription {
    pub fn channel(&self) -> &ChannelName {
        &self.channel
    }

    /// The server's reply to the initial subscribe.
    pub fn info(&self) -> &SubscribeInfo {
        &self.info
    }

    /// The next event; `None` once the subscription ended.
    pub async fn next(&mut self) -> Option<Result<Event, ClientError>> {
        poll_fn(|cx| Pin::new(&mut *self).poll_next(cx)).await
    }

    /// The next message, treating any other event as an error. Convenient in
    /// tests that expect a clean stream.
    pub async fn next_message(&mut self) -> Option<Result<Delivery, ClientError>> {
        Some(match self.next().await? {
            Ok(Event::Message(d)) => Ok(d),
            Ok(other) => Err(ClientError::Protocol(format!("expected a message, got {other:?}"))),
            Err(e) => Err(e),
        })
    }

    /// Unsubscribe and wait until the command is queued.
    pub async fn unsubscribe(mut self) {
        self.unsubscribed = true;
        let cmd = Command::Unsubscribe { id: self.id, channel: self.channel.clone() };
        let _ = self.cmd_tx.send(cmd).await;
    }
}

impl Stream for Subscription {
    type Item = Result<Event, ClientError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match ready!(this.events_rx.poll_recv(cx)) {
            Some(item) => Poll::Ready(Some(item)),
            None => {
                this.done = true;
                Poll::Ready(this.shared.fatal.get().cloned().map(Err))
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if !self.unsubscribed {
            // Best effort: if the queue is full, the worker notices the
            // closed event queue on the next delivery and unsubscribes then.
            let _ = self.cmd_tx.try_send(Command::Unsubscribe { id: self.id, channel: self.channel.clone() });
        }
    }
}
