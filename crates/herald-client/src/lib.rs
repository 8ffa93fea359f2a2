//! Rust client for Herald, used by the integration tests, the `herald tail`
//! and `herald publish` commands and the load generator.
//!
//! Three layers:
//!
//! - [`Connection`]: one WebSocket connection and nothing more. It sends
//!   what it is given and returns every frame in order, so tests can assert
//!   exact wire behaviour. [`Connection::request`] matches a reply to its
//!   `req` while keeping other frames for later.
//! - [`Client`]: the resilient subscriber. One background task owns the
//!   socket, reconnects with exponential backoff and full jitter, resumes
//!   every subscription with `since = {last delivered seq, epoch}`, drops
//!   duplicates by seq, and reports truncation, epoch changes and gaps as
//!   [`Event`]s — never silently.
//! - [`HttpApi`]: publish and history over the HTTP API.
//!
//! What it must never do: deliver a seq twice or out of order to a
//! [`Subscription`], skip seqs without telling the caller, retry a publish
//! on its own (only the caller knows whether it has an idempotency key), or
//! log credentials. Every queue is bounded. No TLS: Herald is reached
//! directly or through a TLS-terminating proxy.

mod backoff;
mod client;
mod command;
mod connection;
mod error;
mod event;
mod handshake;
mod http_api;
mod options;
mod resume;
mod url;
mod worker;

#[cfg(test)]
mod tests;

pub use backoff::Backoff;
pub use client::{Client, Subscription};
pub use connection::{
    Auth, ConnectOptions, Connection, ServerEvent, HANDSHAKE_TIMEOUT, MAX_BUFFERED_FRAMES, MAX_FRAME_BYTES,
};
pub use error::ClientError;
pub use event::{ClientStatus, ConnState, Delivery, Event, PublishReply, SubscribeInfo};
pub use herald_proto::{
    ActionReply, ChannelInfo, ChannelsReply, ConnectionInfo, DisconnectBody, MessageView, Meta, NodeView,
    Since,
};
pub use http_api::{
    DeliverAt, History, HistoryMessage, HttpApi, ItemError, MessageItem, MessageResult, PublishResult,
    RawResponse, ScheduledEntry, ScheduledResult,
};
pub use options::ClientOptions;
pub use url::encode_path_segment;
