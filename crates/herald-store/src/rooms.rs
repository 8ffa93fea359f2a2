//! Room writes on the writer thread: compare-and-set of the record plus the
//! append of its event, in one commit.
//!
//! `rooms` holds each room's record (by channel); `rooms_active` indexes
//! the rooms that are not closed (by channel, empty values). A room write
//! stages, in this order and only if every step passes: the version check
//! against the record as this batch leaves it, the event's append (an
//! ordinary durable append, so it gets the next seq of the room's channel
//! and is fanned out after the commit), the new record, and the index
//! entry. A write to `closed` also closes the channel in the event's append,
//! removes every lease of the channel and the index entry. A refused step
//! stages nothing, so the record and the log never disagree: the log holds
//! exactly one event per version, in version order.

use herald_core::{EngineError, Room, RoomStatus, RoomWrite, RoomWritten};
use herald_proto::ChannelName;

use crate::codec;
use crate::presence::delete_lease;
use crate::stage::{Stage, Staged, Staging};
use crate::storage::{Read, Space, StorageError, WriteSet};
use crate::writer::Writer;

/// `Rooms::room_write`. A version conflict is an `Ok` outcome
/// ([`RoomWritten::Conflict`]) and stages nothing; a refused event append
/// is the write's error.
impl Stage for RoomWrite {
    type Ok = RoomWritten;
    type Err = EngineError;
    const FSYNC: bool = true;

    fn stage(self, w: &mut Writer, st: &mut Staging) -> Staged<Self> {
        let RoomWrite { expected_version, room, mut event } = self;
        let channel = event.channel.clone();
        let current = room_at(w, &channel, &st.ws)?;
        let current_version = current.as_ref().map(|r| r.version);
        if current_version != expected_version {
            st.tally.room_conflicts += 1;
            return Ok(Ok(RoomWritten::Conflict { current }));
        }
        let closing = room.state == RoomStatus::Closed;
        // The contract's shape of a room event, kept here whatever the
        // caller set: durable (one event per version in the log), closing
        // exactly when closing, and no dedup (the version check already
        // makes a retried write a conflict, and a dedup hit would skip the
        // append while the record changes).
        event.durable = true;
        event.closes = closing;
        event.dedup = None;
        let receipt = match event.stage(w, st)? {
            Ok(receipt) => receipt,
            Err(refused) => return Ok(Err(refused)),
        };
        let key = channel.as_str().as_bytes().to_vec();
        st.ws.put(Space::Rooms, key.clone(), codec::encode_room(&room));
        if closing {
            st.ws.delete(Space::RoomsActive, key);
            // No `leave` is announced for these: the final event says it.
            for (lease_key, exp) in w.channel_leases(&channel, &st.ws)? {
                delete_lease(&lease_key, exp, &mut st.ws);
            }
        } else {
            st.ws.put(Space::RoomsActive, key, Vec::new());
        }
        st.tally.room_writes += 1;
        Ok(Ok(RoomWritten::Written { room, receipt }))
    }
}

/// The room record of `channel` as this batch leaves it.
fn room_at(w: &Writer, channel: &ChannelName, ws: &WriteSet) -> Result<Option<Room>, StorageError> {
    let key = channel.as_str().as_bytes();
    let v = match ws.staged(Space::Rooms, key) {
        Some(staged) => staged.map(<[u8]>::to_vec),
        None => w.shared.storage.get(Space::Rooms, key)?,
    };
    Ok(v.map(|v| codec::decode_room(&v)).transpose()?)
}

/// Whether a stored room belongs in `rooms_active`.
pub(crate) fn is_active(room: &Room) -> bool {
    room.state != RoomStatus::Closed
}
