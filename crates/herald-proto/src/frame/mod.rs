//! WebSocket frames, by direction: [`client`] frames (what a client sends:
//! parsed by the server, encoded by the Rust client and the bench) and
//! [`server`] frames (what the server sends: encoded once by the server,
//! read back by clients). The types both directions share (message
//! metadata, resume positions, presence members, frame kinds) live here.
//!
//! Client frames are parsed through a flat struct first so a malformed
//! frame gets a precise error (and so `data` can stay raw JSON, which serde
//! cannot do inside an internally tagged enum).
//!
//! # Stored frames are a durable format
//!
//! The frames of a channel's log — `message`, and `room` for a room's state
//! changes, as [`server::encode_frame`] writes them — are stored, not only
//! sent. The same bytes are
//!
//! - the value of each log entry of the embedded engine (fjall's `log`
//!   keyspace, after a fixed header: herald-store's on-disk layout);
//! - field `f` of each entry of the Redis engine's `p:{c}:log` stream,
//!   built by a template that must give these bytes exactly
//!   (herald-redis's `frame.rs`), and what its pub/sub fan-out carries
//!   between nodes, which may run different versions during an upgrade;
//! - each element of a webhook request's `messages`, signed as they are,
//!   and what history pages ([`server::StoredFrame`]), resuming
//!   subscribers and the clients read back.
//!
//! They outlive the binary that wrote them (for a channel's retention,
//! without end on a channel that keeps everything), so changing a frame is
//! a data migration. The rule:
//!
//! - A field may be added only as optional: old frames lack it, so every
//!   reader takes its absence as the old meaning (`#[serde(default)]`), and
//!   readers ignore fields they do not know (no `deny_unknown_fields` on a
//!   server frame reader, here or in the clients).
//! - A field is never renamed or removed, nor its type or meaning changed,
//!   nor a `type` value, without a format version and a migration of the
//!   stored data in both engines. A frame stays one JSON object ending in
//!   `}` ([`server::mark_redelivered`] appends to the stored bytes).
//! - Readers accept every frame an older version wrote. The tests that
//!   compare `encode_frame` with serde_json's encoding, and the Redis
//!   template with `encode_frame`, pin the bytes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

pub mod client;
pub mod server;

#[cfg(test)]
mod tests;

/// Message metadata: a small map of strings stored and delivered with the
/// message (for example `trace_id`).
pub type Meta = BTreeMap<String, String>;
/// Most entries a `meta` map may have.
pub const MAX_META_ENTRIES: usize = 16;
/// Longest `meta` key or value, in bytes.
pub const MAX_META_VALUE_LEN: usize = 256;

/// Resume position sent with `subscribe`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Since {
    pub seq: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<String>,
}

/// Longest presence `client_id`, in bytes.
pub const MAX_CLIENT_ID_LEN: usize = 128;
/// Longest presence `info` (its JSON text), in bytes.
pub const MAX_MEMBER_INFO_LEN: usize = 1024;

/// A presence `client_id`: 1..=[`MAX_CLIENT_ID_LEN`] bytes, no control
/// characters.
pub fn validate_client_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_CLIENT_ID_LEN || id.chars().any(char::is_control) {
        return Err(format!("`client_id` must be 1..={MAX_CLIENT_ID_LEN} bytes without control characters"));
    }
    Ok(())
}

/// A member of a presence channel, as clients see it (`join`, `leave`,
/// presence lists).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Member {
    /// Stable per client across reconnects; unique per user.
    pub client_id: String,
    /// The token's `sub`.
    pub user: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Opaque JSON from the token's `info` claim or the subscribe frame.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info: Option<serde_json::Value>,
}

/// Check the documented limits of a `meta` map.
pub fn validate_meta(meta: &Meta) -> Result<(), String> {
    if meta.len() > MAX_META_ENTRIES {
        return Err(format!("`meta` has more than {MAX_META_ENTRIES} entries"));
    }
    for (k, v) in meta {
        if k.is_empty() || k.len() > MAX_META_VALUE_LEN || v.len() > MAX_META_VALUE_LEN {
            return Err(format!(
                "`meta` keys must be 1..={MAX_META_VALUE_LEN} bytes and values at most {MAX_META_VALUE_LEN} bytes"
            ));
        }
    }
    Ok(())
}

/// What a stored or broadcast frame is. Apps publish only `Message`; the
/// server makes the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FrameKind {
    /// `{"type":"message",...,"data":...}`: an app message.
    #[default]
    Message,
    /// `{"type":"room",...,"data":{"state":...}}`: a room state change,
    /// logged with the room's messages.
    Room,
    /// `{"type":"join",...,"member":{...}}`: a presence member joined (live only).
    Join,
    /// `{"type":"leave",...,"member":{...}}`: a presence member left (live only).
    Leave,
}

impl FrameKind {
    /// The frame's `type`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Message => "message",
            Self::Room => "room",
            Self::Join => "join",
            Self::Leave => "leave",
        }
    }

    /// The name of the field holding the body: `member` for presence
    /// frames, `data` otherwise.
    pub const fn body_field(self) -> &'static str {
        match self {
            Self::Join | Self::Leave => "member",
            Self::Message | Self::Room => "data",
        }
    }

    /// The stored/broadcast form of `as_str`, for engines that keep it.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "message" => Self::Message,
            "room" => Self::Room,
            "join" => Self::Join,
            "leave" => Self::Leave,
            _ => return None,
        })
    }
}

/// A field present as raw JSON, `null` included (serde's `Option` would
/// make `"data":null` indistinguishable from a missing field).
pub(crate) fn present_raw<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

pub(crate) fn present_raw_owned<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}
