//! What a [`crate::Client`] reports: deliveries and subscription events,
//! replies, and its connection status. Plain data, shared by the handles
//! and the worker.

use herald_proto::{ChannelName, Meta};
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

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
