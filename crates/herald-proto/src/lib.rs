//! The Herald wire contract: WebSocket frames both ways ([`frame`]), HTTP
//! request bodies (`body`) and replies (`reply`), problem documents, error
//! codes and channel names. The server, the Rust client and the bench all
//! use these types: a wire shape is defined here once. The Centrifugo
//! client protocol is here too, in its JSON ([`centrifugo`]) and Protobuf
//! ([`centrifugo_pb`]) encodings.
//!
//! This crate is pure data and (de)serialisation. It must never do IO, depend
//! on tokio, or know about storage. Every wire-visible string (frame types,
//! error codes, close codes) is defined here once; the server maps them to
//! HTTP statuses and close frames through [`ErrorCode`]. Whatever it parses
//! comes from untrusted peers: no input may make it panic (the `fuzz/`
//! targets check that).

mod body;
pub mod centrifugo;
pub mod centrifugo_pb;
mod channel;
mod code;
mod control;
mod data;
pub mod frame;
mod id;
mod reply;

#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;

pub use body::{
    parse_json, BatchBody, BodyError, CreateRoomBody, HistoryPage, HistoryQuery, LimitQuery, MessageItem,
    MessagesBody, PatchRoomBody, PresenceQuery, PublishBody, PublishBodyRef, RequestBody, ScheduledQuery,
};
pub use channel::{ChannelName, ChannelNameError, MAX_CHANNEL_LEN, MAX_LIMITED_USERS};
pub use code::{close, ErrorCode, Problem};
pub use control::{
    ActionReply, ChannelInfo, ChannelsQuery, ChannelsReply, ConnectionInfo, ConnectionsReply, DisconnectBody,
    NodeView, NodesReply, RevokeBody, UserSubscribeBody,
};
pub use data::{check_data, DataError, MAX_DATA_DEPTH_LIMIT};
pub use frame::client::{ClientFrame, ClientFrameError, OutFrame};
pub use frame::server::{
    encode_frame, encode_message_frame, encode_pong, encode_unsubscribed, mark_redelivered, DisconnectFrame,
    ErrorFrame, MessageView, OkFrame, StoredFrame,
};
pub use frame::{
    validate_client_id, validate_meta, FrameKind, Member, Meta, Since, MAX_CLIENT_ID_LEN,
    MAX_MEMBER_INFO_LEN, MAX_META_ENTRIES, MAX_META_VALUE_LEN,
};
pub use id::{check_id, IdError, MAX_ID_LEN};
pub use reply::{
    BatchItem, BatchProblem, BatchReply, ConsumerError, ConsumerPartitionStatus, ConsumerStatus,
    ConsumersStatus, CursorsPage, History, HistoryMessage, Inbox, InboxChannel, InboxDevice, ItemError,
    MessageResult, MessagesReply, ParkedRetried, ParkedRow, ParkedRows, PresenceReply, Published, RoomStatus,
    RoomView, ScheduledBatchReply, ScheduledEntry, ScheduledList, ScheduledReceipt, SubscriberCursor,
    WebhookChannelStatus, WebhookError, WebhookRetrying, WebhookSkipped, WebhookStatus, WebhooksStatus,
};
