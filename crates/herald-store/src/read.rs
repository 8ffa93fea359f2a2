//! The read path: positions and pages, straight from a consistent storage
//! view, never through the writer.
//!
//! Readers see only committed state, and the storage layer makes a commit
//! visible only once it is durable (see `storage.rs`), so a page never holds
//! a message whose append could still fail. The channel meta and the log
//! entries come from one view, so `Page::position` always agrees with
//! `Page::messages`.

use std::ops::{Bound, ControlFlow};
use std::sync::Arc;

use bytes::Bytes;
use herald_core::{Epoch, Message, Page, Position, Seq};
use herald_proto::ChannelName;

use crate::codec::{self, ChannelMeta};
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
