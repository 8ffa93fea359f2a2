//! Cursors on the writer thread: staging acks into the group commit, and
//! counting the unacked messages that retention removes.
//!
//! An ack is a compare-and-raise of one `cursors` entry, staged into the
//! same write set as the appends of its batch. It reads the cursor as
//! this batch left it (acks staged earlier in the batch first, then the
//! store), so the writer, the only committer, applies every ack of a cursor
//! in queue order and the stored value is their running maximum. The
//! `user_cursors` index entry is written with the cursor's first ack only
//! (cursors are never deleted, so it exists from then on).
//!
//! # Unacked messages lost to retention
//!
//! When trimming removes seqs `a..=b` of a channel, the messages in it that
//! some subscriber had not acked are those above the channel's lowest
//! cursor: `b - max(lowest, a - 1)` of them, if positive. They are counted
//! per message, not per subscriber (a message lost to three lagging devices
//! counts once). Subscribers without a cursor are unknown to the engine and
//! do not count.
//!
//! Finding the lowest cursor on every trim would cost a scan of the
//! channel's cursors per append of a full channel, so the writer keeps a
//! [`Floor`] per channel: a lower bound of the lowest cursor that is exact
//! until the subscriber holding it acks. While the trimmed range stays at or
//! below the floor (every subscriber keeps up: the common case) nothing is
//! scanned. A scan happens only when a trim reaches above an inexact floor,
//! and reads at most [`MAX_TRACKED_CURSORS`] + 1 entries: a channel with
//! more cursors than that is not counted (the counter is then a lower
//! bound; such broadcast-size acked channels are expected to be rare).

use std::collections::HashMap;
use std::ops::{Bound, ControlFlow};

use herald_core::{AckError, CursorAck, CursorState};
use herald_proto::ChannelName;

use crate::codec::{self, CursorRecord};
use crate::stage::{Stage, Staged, Staging};
use crate::storage::{Read, Space, Storage, StorageError};
use crate::writer::Writer;

/// Channels with more cursors than this are not counted in
/// `unacked_trimmed` (see the module docs); it bounds one floor scan.
pub(crate) const MAX_TRACKED_CURSORS: usize = 4096;

/// Floors kept at most; past this the map is dropped and rebuilt on demand.
const FLOOR_CACHE_CAP: usize = 65_536;

/// What the writer knows about a channel's lowest cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Floor {
    Tracked {
        /// `<=` every cursor of the channel; `u64::MAX` when it has none.
        min: u64,
        /// `min` is the lowest cursor itself, not only a bound.
        exact: bool,
        /// Cursors of the channel (at most `MAX_TRACKED_CURSORS`).
        count: usize,
    },
    /// Too many cursors to track; trims of this channel are not counted.
    Untracked,
}

impl Floor {
    /// Unacked messages among the trimmed seqs `first..=last`, if `self`
    /// can tell without a scan.
    fn unacked_in(self, first: u64, last: u64) -> Option<u64> {
        match self {
            Floor::Untracked => Some(0),
            Floor::Tracked { min, .. } if last <= min => Some(0),
            Floor::Tracked { min, exact: true, .. } => Some(last - min.max(first.saturating_sub(1))),
            Floor::Tracked { exact: false, .. } => None,
        }
    }
}

/// The writer's cursor state: acks staged in the current batch, and floors.
#[derive(Default)]
pub(crate) struct CursorBook {
    /// Cursors staged by the current batch, by cursor key; emptied after
    /// every commit (then the store has them).
    batch: HashMap<Vec<u8>, CursorRecord>,
    floors: HashMap<ChannelName, Floor>,
}

impl CursorBook {
    /// The batch was committed: its cursors are in the store now.
    pub fn end_batch(&mut self) {
        self.batch.clear();
        if self.floors.len() > FLOOR_CACHE_CAP {
            self.floors.clear();
        }
    }

    /// A commit failed: nothing staged became visible, forget it all.
    pub fn reset(&mut self) {
        self.batch.clear();
        self.floors.clear();
    }

    /// The cursor at `key` as the current batch leaves it.
    fn current(&self, storage: &Storage, key: &[u8]) -> Result<Option<CursorRecord>, StorageError> {
        if let Some(rec) = self.batch.get(key) {
            return Ok(Some(*rec));
        }
        match storage.get(Space::Cursors, key)? {
            Some(v) => Ok(Some(CursorRecord::decode(&v)?)),
            None => Ok(None),
        }
    }

    /// Keep the channel's floor a lower bound after a cursor moved from
    /// `old` (`None`: created) to `new`.
    fn note_ack(&mut self, channel: &ChannelName, old: Option<u64>, new: u64) {
        let Some(floor) = self.floors.get_mut(channel) else { return };
        let Floor::Tracked { min, exact, count } = floor else { return };
        match old {
            None if *count >= MAX_TRACKED_CURSORS => *floor = Floor::Untracked,
            None => {
                // A new lowest cursor is exactly known; otherwise the old
                // bound (exact or not) still holds.
                *min = (*min).min(new);
                *count += 1;
            }
            // The lowest cursor may have risen: `min` stays a bound only.
            Some(old) if old <= *min => *exact = false,
            Some(_) => {}
        }
    }

    /// How many of the seqs `first..=last` of `channel`, about to be
    /// trimmed, were above the lowest cursor (unacked by someone).
    pub fn unacked_in(
        &mut self,
        storage: &Storage,
        channel: &ChannelName,
        first: u64,
        last: u64,
    ) -> Result<u64, StorageError> {
        if last < first {
            return Ok(0);
        }
        if let Some(n) = self.floors.get(channel).and_then(|f| f.unacked_in(first, last)) {
            return Ok(n);
        }
        let floor = self.scan_floor(storage, channel)?;
        self.floors.insert(channel.clone(), floor);
        Ok(floor.unacked_in(first, last).unwrap_or(0))
    }

    /// The exact floor of `channel`: its committed cursors, overlaid with
    /// those staged by the current batch.
    fn scan_floor(&self, storage: &Storage, channel: &ChannelName) -> Result<Floor, StorageError> {
        let prefix = codec::cursor_prefix(channel.as_str());
        let mut upper = prefix.clone();
        // `\0` is the separator; `\x01` ends the channel's range.
        *upper.last_mut().expect("prefix ends with the separator") = 1;
        let mut cursors: HashMap<Vec<u8>, u64> = HashMap::new();
        let mut too_many = false;
        storage.scan(Space::Cursors, (Bound::Included(prefix.clone()), Bound::Excluded(upper)), |k, v| {
            cursors.insert(k.to_vec(), CursorRecord::decode(v)?.seq);
            too_many = cursors.len() > MAX_TRACKED_CURSORS;
            Ok(if too_many { ControlFlow::Break(()) } else { ControlFlow::Continue(()) })
        })?;
        if too_many {
            return Ok(Floor::Untracked);
        }
        for (k, rec) in &self.batch {
            if k.starts_with(&prefix) {
                cursors.insert(k.clone(), rec.seq);
            }
        }
        if cursors.len() > MAX_TRACKED_CURSORS {
            return Ok(Floor::Untracked);
        }
        let min = cursors.values().copied().min().unwrap_or(u64::MAX);
        Ok(Floor::Tracked { min, exact: true, count: cursors.len() })
    }
}

/// [`Cursors::cursor_ack`](herald_core::Cursors::cursor_ack): raise
/// `subscriber`'s cursor on `channel` to `seq`.
impl Stage for CursorAck {
    type Ok = CursorState;
    type Err = AckError;
    /// Acks never cost an fsync of their own (see the crate docs).
    const FSYNC: bool = false;

    fn stage(self, w: &mut Writer, st: &mut Staging) -> Staged<Self> {
        // The head as this batch leaves it (includes appends staged before
        // the ack; they commit atomically with it).
        let head = w.channel_meta(&self.channel)?.head;
        if self.seq > head {
            st.tally.acks_beyond_head += 1;
            return Ok(Err(AckError::BeyondHead { seq: self.seq, head }));
        }
        let channel = self.channel.as_str();
        let subscriber = self.subscriber.key();
        let key = codec::cursor_key(channel, &subscriber);
        let stored = w.cursors.current(&w.shared.storage, &key)?;
        if let Some(rec) = stored {
            if rec.seq >= self.seq {
                // Monotonic: a lower or equal ack changes nothing, so a
                // redelivered message's second ack costs no write.
                st.tally.acks_unchanged += 1;
                return Ok(Ok(rec.state()));
            }
        }
        let rec = CursorRecord { seq: self.seq, acked_at_ms: w.shared.clock.now_ms() };
        st.ws.put(Space::Cursors, key.clone(), rec.encode());
        if stored.is_none() {
            st.ws.put(Space::UserCursors, codec::user_cursor_key(&subscriber, channel), Vec::new());
        }
        w.cursors.note_ack(&self.channel, stored.map(|r| r.seq), rec.seq);
        w.cursors.batch.insert(key, rec);
        st.tally.acks += 1;
        Ok(Ok(rec.state()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_counts_messages_above_the_lowest_cursor() {
        let exact = |min| Floor::Tracked { min, exact: true, count: 1 };
        assert_eq!(exact(5).unacked_in(1, 3), Some(0), "all acked");
        assert_eq!(exact(5).unacked_in(1, 5), Some(0));
        assert_eq!(exact(2).unacked_in(1, 5), Some(3), "3, 4, 5 unacked");
        assert_eq!(exact(0).unacked_in(4, 6), Some(3), "all of them");
        assert_eq!(exact(u64::MAX).unacked_in(1, 100), Some(0), "no cursors");
        let bound = Floor::Tracked { min: 2, exact: false, count: 1 };
        assert_eq!(bound.unacked_in(1, 2), Some(0), "below a bound: known without a scan");
        assert_eq!(bound.unacked_in(1, 3), None, "above an inexact bound: needs a scan");
        assert_eq!(Floor::Untracked.unacked_in(1, 100), Some(0));
    }

    #[test]
    fn acks_keep_the_floor_a_lower_bound() {
        let ch = ChannelName::new("c:1").unwrap();
        let mut book = CursorBook::default();
        book.note_ack(&ch, None, 3); // untracked channel: ignored
        assert!(book.floors.is_empty());

        book.floors.insert(ch.clone(), Floor::Tracked { min: 5, exact: true, count: 2 });
        book.note_ack(&ch, Some(7), 9); // not the lowest: still exact
        assert_eq!(book.floors[&ch], Floor::Tracked { min: 5, exact: true, count: 2 });
        book.note_ack(&ch, None, 1); // a new, lower cursor: exact
        assert_eq!(book.floors[&ch], Floor::Tracked { min: 1, exact: true, count: 3 });
        book.note_ack(&ch, Some(1), 4); // the lowest moved: a bound only
        assert_eq!(book.floors[&ch], Floor::Tracked { min: 1, exact: false, count: 3 });

        book.floors.insert(ch.clone(), Floor::Tracked { min: 0, exact: true, count: MAX_TRACKED_CURSORS });
        book.note_ack(&ch, None, 0);
        assert_eq!(book.floors[&ch], Floor::Untracked);
    }
}
