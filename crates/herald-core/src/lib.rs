//! Herald's domain core: namespaces and their options, the delivery model,
//! and the [`Engine`] contract behind which everything durable and
//! cross-node lives, split by concern into [`Log`], [`Cursors`],
//! [`Presence`], [`Rooms`] and [`Lifecycle`].
//!
//! This crate must never open a socket, know about HTTP or WebSocket
//! libraries, or name a storage backend. Engines (embedded, Redis) implement
//! the parts of [`Engine`], with the engine-independent pieces from here
//! ([`feed`]: a channel's gap-free feed over a lossy transport, and the
//! watch counts; [`engine_counters!`]: counters from one table); the server
//! drives them.

pub mod delivery;
pub mod engine;
pub mod feed;
pub mod namespace;
pub mod presence;
mod queued_bytes;
pub mod room;

#[cfg(feature = "conformance")]
pub mod conformance;

pub use engine::{
    AckError, AppendRequest, CursorAck, CursorState, Cursors, Dedup, Engine, EngineError, EngineMetric,
    Epoch, FanoutSink, Health, InvalidSubscriber, LeaseJoin, LeaseLeave, LeaseRejoin, LeaseRenew, Lifecycle,
    Log, Message, Owned, Ownership, Page, Position, Presence, Receipt, Retention, RoomWrite, RoomWritten,
    Rooms, Seq, SubscriberId, UserCursor,
};
pub use engine::{Admission, Ban, Control, ControlSink, NodeView};
pub use engine::{Claim, Delivered, Schedule, ScheduleReceipt, ScheduleRequest, Schedules};
pub use namespace::{Delivery, NamespaceOptions, Namespaces, StartAt, UnknownNamespace};
pub use presence::{member_key, FenceToken, Joined, Lease, Member, Rejoined, Renewed, GONE_CAP, GONE_MEMORY};
pub use queued_bytes::QueuedLen;
pub use room::{IllegalTransition, Room, RoomReason, RoomStatus};
