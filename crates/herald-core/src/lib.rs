//! Herald's domain core: namespaces and their options, the delivery model,
//! and the [`Engine`] trait behind which everything durable and cross-node
//! lives.
//!
//! This crate must never open a socket, know about HTTP or WebSocket
//! libraries, or name a storage backend. Engines (embedded, Redis) implement
//! [`Engine`]; the server drives them.

pub mod delivery;
pub mod engine;
pub mod namespace;
pub mod presence;
pub mod room;

#[cfg(feature = "conformance")]
pub mod conformance;

pub use engine::{
    AckError, AppendRequest, CursorState, Dedup, Engine, EngineError, EngineMetric, Epoch, FanoutSink,
    Health, InvalidSubscriber, Message, Page, Position, Receipt, Retention, RoomWrite, RoomWritten, Seq,
    SubscriberId, UserCursor,
};
pub use namespace::{Delivery, NamespaceOptions, Namespaces, StartAt, UnknownNamespace};
pub use presence::{member_key, FenceToken, Joined, Lease, Member, Rejoined, Renewed, GONE_CAP, GONE_MEMORY};
pub use room::{IllegalTransition, Room, RoomReason, RoomStatus};
