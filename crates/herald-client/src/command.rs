//! What the handles send the worker ([`Command`]) and the little state
//! they share ([`Shared`]). Both sides import this module; neither imports
//! the other's internals.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::OnceLock;

use herald_proto::{ChannelName, Meta};
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot, Notify};

use crate::event::{Event, PublishReply, SubscribeInfo};
use crate::ClientError;

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

/// A subscription the server made (a `subscribed` frame: the personal
/// channel), handed to [`crate::Client::next_server_subscription`].
pub(crate) struct ServerSubscribed {
    pub id: u64,
    pub info: SubscribeInfo,
    pub events_rx: mpsc::Receiver<Result<Event, ClientError>>,
}

/// A publish request; also how it waits for a connection.
pub(crate) struct PublishCmd {
    pub channel: Box<str>,
    pub data: Box<RawValue>,
    pub meta: Option<Meta>,
    pub idempotency_key: Option<String>,
    pub reply: oneshot::Sender<Result<PublishReply, ClientError>>,
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
    pub(crate) fn closed_error(&self) -> ClientError {
        self.fatal.get().cloned().unwrap_or(ClientError::Shutdown)
    }
}
