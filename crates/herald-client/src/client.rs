//! [`Client`]: the resilient, high-level client. One background task per
//! client owns the socket (see `worker/`); the handles here only talk to
//! it over bounded channels.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use herald_proto::{ChannelName, Meta};
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot, watch};

use crate::command::{Command, PublishCmd, ServerSubscribed, Shared, SubscribeCmd};
use crate::event::{ClientStatus, ConnState, Delivery, Event, PublishReply, SubscribeInfo};
use crate::options::ClientOptions;
use crate::worker::Worker;
use crate::ClientError;

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
    /// Server-made subscriptions (`ClientOptions::server_subscriptions`).
    server_subs: Option<tokio::sync::Mutex<mpsc::Receiver<ServerSubscribed>>>,
}

impl Client {
    /// Start the background task and begin connecting. Must be called inside
    /// a tokio runtime.
    pub fn new(opts: ClientOptions) -> Self {
        let (cmd_tx, cmd_rx) = mpsc::channel(opts.command_capacity.max(1));
        let (status_tx, status_rx) =
            watch::channel(ClientStatus { state: ConnState::Connecting, connects: 0 });
        let shared = Arc::new(Shared::default());
        let (server_tx, server_rx) = match opts.server_subscriptions {
            true => {
                let (tx, rx) = mpsc::channel(16);
                (Some(tx), Some(tokio::sync::Mutex::new(rx)))
            }
            false => (None, None),
        };
        let client = Self {
            cmd_tx,
            shared: shared.clone(),
            status_rx,
            request_timeout: opts.request_timeout,
            event_capacity: opts.event_capacity.max(1),
            server_subs: server_rx,
        };
        tokio::spawn(Worker::new(opts, cmd_rx, shared, status_tx, server_tx).run());
        client
    }

    /// The next subscription the server made for this client (the personal
    /// channel: docs/protocol.md, `subscribed`), once. It is resumed by the
    /// server on each reconnect and ends like any [`Subscription`]
    /// (dropping it unsubscribes). `None` when
    /// [`ClientOptions::server_subscriptions`] is off or the client ended.
    pub async fn next_server_subscription(&self) -> Option<Subscription> {
        let ServerSubscribed { id, info, events_rx } = self.server_subs.as_ref()?.lock().await.recv().await?;
        Some(self.subscription(id, info, events_rx))
    }

    /// The handle of subscription `id`, reading `events_rx`.
    fn subscription(
        &self,
        id: u64,
        info: SubscribeInfo,
        events_rx: mpsc::Receiver<Result<Event, ClientError>>,
    ) -> Subscription {
        Subscription {
            id,
            channel: info.channel.clone(),
            info,
            events_rx,
            cmd_tx: self.cmd_tx.clone(),
            shared: self.shared.clone(),
            done: false,
            unsubscribed: false,
        }
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
        let cmd =
            Command::Subscribe(Box::new(SubscribeCmd { id, channel, since, events_tx, reply: reply_tx }));
        let info = self.call(cmd, reply_rx).await?;
        Ok(self.subscription(id, info, events_rx))
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
