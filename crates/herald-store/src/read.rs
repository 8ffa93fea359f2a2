//! The read path: positions, pages and cursors, straight from a consistent
//! storage view, never through the writer.
//!
//! Readers see only committed state, and the storage layer makes a commit
//! visible only once it is durable (see `storage.rs`), so a page never holds
//! a message whose append could still fail. The channel meta and the log
//! entries come from one view, so `Page::position` always agrees with
//! `Page::messages`.

use std::ops::{Bound, ControlFlow};
use std::sync::Arc;

use bytes::Bytes;
use herald_core::{CursorState, Epoch, Message, Page, Position, Seq, SubscriberId, UserCursor};
use herald_proto::ChannelName;

use crate::codec::{self, ChannelMeta, CursorRecord};
use crate::storage::{Space, Storage, StorageError, View};

fn load_meta(view: &View<'_>, channel: &ChannelName) -> Result<ChannelMeta, StorageError> {
    match view.get(Space::Channels, channel.as_str().as_bytes())? {
        Some(v) => Ok(ChannelMeta::decode(&v)?),
        None => Ok(ChannelMeta::default()),
    }
}

fn to_position(epoch: &Epoch, meta: &ChannelMeta) -> Position {
    Position { epoch: epoch.clone(), first: meta.first, head: meta.head }
}

pub(crate) fn position(storage: &Storage, channel: &ChannelName) -> Result<Position, StorageError> {
    let meta = load_meta(&storage.view(), channel)?;
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
    let meta = load_meta(&view, channel)?;
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
    let range = (Bound::Included(codec::log_key(name, start)), Bound::Included(codec::log_key(name, end)));
    view.scan(Space::Log, range, |k, v| {
        let seq = codec::log_key_seq(name, k)?;
        if seq != expected {
            return Err(gap(name, expected));
        }
        let (header, frame) = codec::decode_log_value(v)?;
        messages.push(Arc::new(Message {
            channel: channel.clone(),
            seq: Some(seq),
            id: Arc::from(header.id.hyphenated().to_string()),
            ts: header.ts,
            epoch: epoch.clone(),
            frame: Bytes::copy_from_slice(frame),
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
