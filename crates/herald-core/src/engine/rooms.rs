//! Room records: compare-and-set on a version, with the room event in the
//! same atomic step (the state machine is in [`crate::room`]).

use async_trait::async_trait;
use herald_proto::ChannelName;

use super::{AppendRequest, EngineError, Receipt};
use crate::room::Room;

/// The result of [`Rooms::room_write`].
#[derive(Debug)]
pub enum RoomWritten {
    /// The record is now `room`, and its event was appended with `receipt`.
    Written { room: Room, receipt: Receipt },
    /// Nothing was written: the stored version is not the expected one (or
    /// the room exists on create, or is missing on update). `current` is the
    /// stored record.
    Conflict { current: Option<Room> },
}

/// A compare-and-set of a room's record plus its event.
#[derive(Debug)]
pub struct RoomWrite {
    /// The version the record must have now; `None` = create (the room must
    /// not exist).
    pub expected_version: Option<u64>,
    /// The new record; its `version` is `expected_version + 1` (1 on create).
    pub room: Room,
    /// The room event: durable, on the room's channel, `kind` [`FrameKind::Room`](herald_proto::FrameKind::Room),
    /// `closes` set exactly when `room.state` is closed.
    pub event: AppendRequest,
}

/// Room records (see [`crate::room`]).
#[async_trait]
pub trait Rooms: Send + Sync + 'static {
    /// The room record of `channel`, if it was created.
    async fn room(&self, channel: &ChannelName) -> Result<Option<Room>, EngineError>;

    /// Compare-and-set the room record on `write.expected_version` and
    /// append `write.event` to the room's channel, as one atomic step: both
    /// happen or neither. When the new state is closed the same step closes
    /// the channel, removes every lease of it (no `leave` is announced: the
    /// final event says it all) and takes the room out of
    /// [`rooms_active`](Rooms::rooms_active). A write to a room whose
    /// channel is already closed is [`EngineError::Closed`].
    async fn room_write(&self, write: RoomWrite) -> Result<RoomWritten, EngineError>;

    /// Up to `limit` rooms that are not closed, with channel names greater
    /// than `after`, in name order (for the keeper that drives timers).
    async fn rooms_active(
        &self,
        after: Option<&ChannelName>,
        limit: usize,
    ) -> Result<Vec<(ChannelName, Room)>, EngineError>;
}
