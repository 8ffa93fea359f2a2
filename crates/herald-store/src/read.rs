//! The read path: positions, pages, cursors, presence and rooms, straight
//! from a consistent storage view, never through the writer.
//!
//! Readers see only committed state, and the storage layer makes a commit
//! visible only once it is durable (see `storage.rs`), so a page never holds
//! a message whose append could still fail. The channel meta and the log
//! entries come from one view, so `Page::position` always agrees with
//! `Page::messages`.
//!
//! Leases are filtered by the engine's clock (shared with the writer): one
//! with `expires_at_ms <= now` is not listed or counted, whether or not
//! `presence_expire` removed it yet.

use std::ops::{Bound, ControlFlow};
use std::sync::Arc;

use bytes::Bytes;
use herald_core::{CursorState, Epoch, Lease, Message, Page, Position, Room, Seq, SubscriberId, UserCursor};
use herald_proto::ChannelName;

use crate::codec::{self, ChannelMeta, CursorRecord, LeaseRecord};
use crate::storage::{Read, Space, Storage, StorageError, View};

fn to_position(epoch: &Epoch, meta: &ChannelMeta) -> Position {
    Position { epoch: epoch.clone(), first: meta.first, head: meta.head, closed: meta.closed }
}

pub(crate) fn position(storage: &Storage, channel: &ChannelName) -> Result<Position, StorageError> {
    let meta = storage.view().channel_meta(channel.as_str())?;
    Ok(to_position(storage.epoch(), &meta))
}

/// Up to `limit` messages with `seq > after`, starting at `first` when
/// `after + 1` is gone; ascending and gap-free (a gap is corruption).
pub(crate) fn read_page(
    storage: &Storage,
    channel: &ChannelName,
    after: Seq,
    limit: usize,
) -> Result<Page, StorageError> {
    let view = storage.view();
    let meta = view.channel_meta(channel.as_str())?;
    let epoch = storage.epoch();
    let position = to_position(epoch, &meta);
    let start = after.saturating_add(1).max(meta.first);
    if limit == 0 || start > meta.head {
        return Ok(Page { position, messages: Vec::new() });
    }
    let limit = u64::try_from(limit).unwrap_or(u64::MAX);
    let end = meta.head.min(start.saturating_add(limit - 1));
    let name = channel.as_str();
    // At most `limit` entries, and never more than the log holds.
    let mut messages = Vec::with_capacity(usize::try_from(end - start + 1).unwrap_or(0).min(1024));
    let mut expected = start;
    let log = storage.key_layout().log(name);
    let range = (Bound::Included(log.key(start)), Bound::Included(log.key(end)));
    view.scan(Space::Log, range, |k, v| {
        let seq = log.seq(k)?;
        if seq != expected {
            return Err(gap(name, expected));
        }
        let (header, frame) = codec::decode_log_value(v)?;
        messages.push(Arc::new(Message {
            channel: channel.clone(),
            seq: Some(seq),
            id: codec::id_str(&header.id),
            ts: header.ts,
            epoch: epoch.clone(),
            frame: Bytes::copy_from_slice(frame),
            closes: meta.closed && seq == meta.head,
        }));
        expected += 1;
        Ok(ControlFlow::Continue(()))
    })?;
    if expected != end + 1 {
        return Err(gap(name, expected));
    }
    Ok(Page { position, messages })
}

fn gap(channel: &str, seq: Seq) -> StorageError {
    StorageError::Corrupt(format!("channel {channel}: seq {seq} is missing from the log"))
}

/// The subscriber's cursor on `channel`.
pub(crate) fn cursor(
    storage: &Storage,
    channel: &ChannelName,
    subscriber: &SubscriberId,
) -> Result<Option<CursorState>, StorageError> {
    let key = codec::cursor_key(channel.as_str(), &subscriber.key());
    match storage.view().get(Space::Cursors, &key)? {
        Some(v) => Ok(Some(CursorRecord::decode(&v)?.state())),
        None => Ok(None),
    }
}

/// Up to `limit` cursors of `channel`, in subscriber-key order.
pub(crate) fn cursors(
    storage: &Storage,
    channel: &ChannelName,
    limit: usize,
) -> Result<Vec<(SubscriberId, CursorState)>, StorageError> {
    let mut out = Vec::new();
    if limit == 0 {
        return Ok(out);
    }
    let name = channel.as_str();
    let prefix = codec::cursor_prefix(name);
    storage.view().scan(Space::Cursors, (Bound::Included(prefix.clone()), Bound::Unbounded), |k, v| {
        if !k.starts_with(&prefix) {
            return Ok(ControlFlow::Break(()));
        }
        let subscriber = parse_subscriber(codec::cursor_key_subscriber(name, k)?)?;
        out.push((subscriber, CursorRecord::decode(v)?.state()));
        Ok(if out.len() >= limit { ControlFlow::Break(()) } else { ControlFlow::Continue(()) })
    })?;
    Ok(out)
}

/// Up to `limit` cursors of `user`: a prefix scan of the `user_cursors`
/// index, each entry resolved in the same view. The index entry and the
/// cursor are written in one commit and never deleted, so an entry without
/// its cursor is corruption.
pub(crate) fn user_cursors(
    storage: &Storage,
    user: &str,
    limit: usize,
) -> Result<Vec<UserCursor>, StorageError> {
    let mut out = Vec::new();
    let Some(prefix) = SubscriberId::user_prefix(user) else { return Ok(out) };
    if limit == 0 {
        return Ok(out);
    }
    let view = storage.view();
    let mut entries = Vec::new();
    let prefix = prefix.into_bytes();
    view.scan(Space::UserCursors, (Bound::Included(prefix.clone()), Bound::Unbounded), |k, _| {
        if !k.starts_with(&prefix) {
            return Ok(ControlFlow::Break(()));
        }
        entries.push(k.to_vec());
        Ok(if entries.len() >= limit { ControlFlow::Break(()) } else { ControlFlow::Continue(()) })
    })?;
    for k in entries {
        let (sub_key, channel) = codec::split_user_cursor_key(&k)?;
        let subscriber = parse_subscriber(sub_key)?;
        let channel = ChannelName::new(channel)
            .map_err(|e| StorageError::Corrupt(format!("user cursor index: bad channel name: {e}")))?;
        let v =
            view.get(Space::Cursors, &codec::cursor_key(channel.as_str(), sub_key))?.ok_or_else(|| {
                StorageError::Corrupt(format!(
                    "user cursor index entry for {channel} {subscriber:?} has no cursor"
                ))
            })?;
        out.push(UserCursor {
            channel,
            device: subscriber.device_arc().cloned(),
            cursor: CursorRecord::decode(&v)?.state(),
        });
    }
    Ok(out)
}

fn parse_subscriber(key: &str) -> Result<SubscriberId, StorageError> {
    SubscriberId::parse_key(key)
        .map_err(|e| StorageError::Corrupt(format!("bad subscriber key {key:?}: {e}")))
}

/// Visit the leases of `channel` whose member key starts with `member_prefix`
/// in key order, until `f` breaks.
fn scan_leases(
    view: &View<'_>,
    channel: &ChannelName,
    member_prefix: &str,
    mut f: impl FnMut(&[u8]) -> Result<ControlFlow<()>, StorageError>,
) -> Result<(), StorageError> {
    let prefix = codec::presence_key(channel.as_str(), member_prefix);
    view.scan(Space::Presence, (Bound::Included(prefix.clone()), Bound::Unbounded), |k, v| {
        if !k.starts_with(&prefix) {
            return Ok(ControlFlow::Break(()));
        }
        f(v)
    })
}

/// Up to `limit` unexpired leases of `channel`, in member-key order.
pub(crate) fn presence(
    storage: &Storage,
    channel: &ChannelName,
    limit: usize,
    now_ms: u64,
) -> Result<Vec<Lease>, StorageError> {
    let mut out = Vec::new();
    if limit == 0 {
        return Ok(out);
    }
    scan_leases(&storage.view(), channel, "", |v| {
        // The header first: expired leases cost no JSON parsing.
        if LeaseRecord::decode_header(v)?.1 > now_ms {
            out.push(LeaseRecord::decode(v)?.lease());
        }
        Ok(if out.len() >= limit { ControlFlow::Break(()) } else { ControlFlow::Continue(()) })
    })?;
    Ok(out)
}

/// How many unexpired leases `channel` has: one scan of its leases,
/// reading their fixed headers only.
pub(crate) fn presence_count(
    storage: &Storage,
    channel: &ChannelName,
    now_ms: u64,
) -> Result<u64, StorageError> {
    let mut n = 0;
    scan_leases(&storage.view(), channel, "", |v| {
        n += u64::from(LeaseRecord::decode_header(v)?.1 > now_ms);
        Ok(ControlFlow::Continue(()))
    })?;
    Ok(n)
}

/// Whether `user` has an unexpired lease on `channel`: a scan of that
/// user's member keys only (`{len}:{user}` prefixes them and no other
/// user's, see `herald_core::member_key`).
pub(crate) fn presence_has_user(
    storage: &Storage,
    channel: &ChannelName,
    user: &str,
    now_ms: u64,
) -> Result<bool, StorageError> {
    let mut found = false;
    scan_leases(&storage.view(), channel, &format!("{}:{user}", user.len()), |v| {
        found = LeaseRecord::decode_header(v)?.1 > now_ms;
        Ok(if found { ControlFlow::Break(()) } else { ControlFlow::Continue(()) })
    })?;
    Ok(found)
}

pub(crate) fn room(storage: &Storage, channel: &ChannelName) -> Result<Option<Room>, StorageError> {
    match storage.view().get(Space::Rooms, channel.as_str().as_bytes())? {
        Some(v) => Ok(Some(codec::decode_room(&v)?)),
        None => Ok(None),
    }
}

/// Up to `limit` rooms that are not closed, with channel names after
/// `after`, in name order: a scan of the `rooms_active` index, each entry
/// resolved in the same view. The entry and the record are written in one
/// commit, so an entry without an active record is corruption.
pub(crate) fn rooms_active(
    storage: &Storage,
    after: Option<&ChannelName>,
    limit: usize,
) -> Result<Vec<(ChannelName, Room)>, StorageError> {
    let mut names = Vec::new();
    if limit == 0 {
        return Ok(Vec::new());
    }
    let view = storage.view();
    let from = match after {
        Some(c) => Bound::Excluded(c.as_str().as_bytes().to_vec()),
        None => Bound::Unbounded,
    };
    view.scan(Space::RoomsActive, (from, Bound::Unbounded), |k, _| {
        names.push(k.to_vec());
        Ok(if names.len() >= limit { ControlFlow::Break(()) } else { ControlFlow::Continue(()) })
    })?;
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let channel =
            std::str::from_utf8(&name).ok().and_then(|s| ChannelName::new(s).ok()).ok_or_else(|| {
                StorageError::Corrupt(format!("bad active room key {:?}", String::from_utf8_lossy(&name)))
            })?;
        let room = match view.get(Space::Rooms, &name)? {
            Some(v) => codec::decode_room(&v)?,
            None => return Err(StorageError::Corrupt(format!("active room {channel} has no record"))),
        };
        if !crate::rooms::is_active(&room) {
            return Err(StorageError::Corrupt(format!("closed room {channel} is indexed as active")));
        }
        out.push((channel, room));
    }
    Ok(out)
}
