//! Server frames (server → client): replies (`ok`, `error`, `pong`),
//! `disconnect`, `unsubscribed`, and the message frames encoded once at
//! append and shared by every subscriber; [`MessageView`] reads any of them
//! back (clients, tests).
//!
//! The frames [`encode_frame`] writes for a channel's log (`message`,
//! `room`) are stored by both engines and sent in webhook bodies: they are
//! a durable format, changed only as [the parent module](super#stored-frames-are-a-durable-format)
//! says (optional fields added; nothing renamed, removed or changed in
//! meaning without a format version and a migration; readers accept older
//! frames).

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{present_raw, present_raw_owned, FrameKind, Member, Meta};
use crate::{ChannelName, ErrorCode};

/// `{"type":"ok",...}`: the reply to a request. Fields not relevant to the
/// request are omitted.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
pub struct OkFrame {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub req: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// Subscribe: the channel log's epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<String>,
    /// Subscribe: oldest retained seq.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first: Option<u64>,
    /// Subscribe: last seq.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<u64>,
    /// Subscribe: messages after `since.seq` were removed by retention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<bool>,
    /// Subscribe: `since.epoch` did not match; delivery restarts at `first`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch_changed: Option<bool>,
    /// Subscribe on an acked channel: the subscriber's stored cursor (highest
    /// acked seq; 0 if it never acked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<u64>,
    /// Subscribe on an acked channel: messages this subscription will deliver
    /// before it is live (`head` minus what the subscriber already has).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unread: Option<u64>,
    /// A `subscribed` frame of a subscription the server made from a
    /// position: delivery starts after this seq (absent: after `head`, or
    /// after `cursor` on an acked channel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<u64>,
    /// Publish: assigned seq (absent for volatile channels).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// Publish: message id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Publish: the idempotency key matched an earlier publish.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate: Option<bool>,
    /// Subscribe on a presence channel: this connection's member id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// Presence: how many members the channel has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Presence: the members (up to the server's listing limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<Vec<Member>>,
}

impl OkFrame {
    pub fn encode(&self) -> Vec<u8> {
        encode_tagged("ok", self)
    }

    /// `{"type":"subscribed",...}`: a subscription the server made (the
    /// personal channel), with the fields a subscribe's `ok` has and no
    /// `req`.
    pub fn encode_subscribed(&self) -> Vec<u8> {
        encode_tagged("subscribed", self)
    }

    /// The `ok` of a publish: the same bytes as an `OkFrame` with `req`,
    /// `channel`, `seq`, `id` and `duplicate` set, written directly (every
    /// publish gets one; see [`encode_frame`] for why).
    pub fn encode_published(
        req: Option<u64>,
        channel: &str,
        seq: Option<u64>,
        id: &str,
        duplicate: bool,
    ) -> Vec<u8> {
        let mut out = Vec::with_capacity(96 + channel.len() + id.len());
        Self::push_published(&mut out, req, channel, seq, id, duplicate);
        out
    }

    /// [`OkFrame::encode_published`] appended to `out` (a session writes
    /// the `ok`s of a batch of publishes into one buffer).
    pub fn push_published(
        out: &mut Vec<u8>,
        req: Option<u64>,
        channel: &str,
        seq: Option<u64>,
        id: &str,
        duplicate: bool,
    ) {
        out.extend_from_slice(b"{\"type\":\"ok\"");
        if let Some(req) = req {
            out.extend_from_slice(b",\"req\":");
            push_u64(out, req);
        }
        out.push(b',');
        push_placement(out, channel, seq, id);
        out.extend_from_slice(if duplicate { b",\"duplicate\":true}" } else { b",\"duplicate\":false}" });
    }
}

/// `"channel":C,"seq":N,"id":I` (no `seq` when `None`): where a publish
/// went, as the socket `ok` and the HTTP `Published` reply both write it.
pub(crate) fn push_placement(out: &mut Vec<u8>, channel: &str, seq: Option<u64>, id: &str) {
    out.extend_from_slice(b"\"channel\":");
    push_str(out, channel);
    if let Some(seq) = seq {
        out.extend_from_slice(b",\"seq\":");
        push_u64(out, seq);
    }
    out.extend_from_slice(b",\"id\":");
    push_str(out, id);
}

/// Append `s` as a JSON string, byte for byte what serde_json writes: a
/// string with nothing to escape (ids and channel names always) is copied
/// as it is; any other goes through serde_json.
pub(crate) fn push_str(out: &mut Vec<u8>, s: &str) {
    // No early exit: the whole string is folded, which the compiler turns
    // into wide compares (strings here are short, and nearly always clean).
    let escapes = s.bytes().fold(false, |any, b| any | (b < 0x20) | (b == b'"') | (b == b'\\'));
    if !escapes {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        serde_json::to_writer(&mut *out, s).expect("a string always serialises");
    }
}

fn push_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `{"type":"error",...}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorFrame {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub req: Option<u64>,
    pub code: ErrorCode,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
}

impl ErrorFrame {
    pub fn encode(&self) -> Vec<u8> {
        encode_tagged("error", self)
    }
}

/// `{"type":"disconnect",...}`: sent right before the server closes a socket.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DisconnectFrame {
    pub code: u16,
    pub reason: String,
    pub reconnect: bool,
}

impl DisconnectFrame {
    pub fn encode(&self) -> Vec<u8> {
        encode_tagged("disconnect", self)
    }
}

/// `{"type":"pong","req":N}`.
pub fn encode_pong(req: Option<u64>) -> Vec<u8> {
    #[derive(Serialize)]
    struct Pong {
        #[serde(skip_serializing_if = "Option::is_none")]
        req: Option<u64>,
    }
    encode_tagged("pong", &Pong { req })
}

/// `{"type":"<kind>", <the fields of body>}`. `body` (a struct) is written
/// as an object and spliced in after `type`: the same bytes
/// `#[serde(flatten)]` gives, without its map serializer (this encodes the
/// `ok` of every publish).
fn encode_tagged<T: Serialize>(kind: &'static str, body: &T) -> Vec<u8> {
    debug_assert!(
        kind.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
        "a frame type needs no escaping"
    );
    let mut out = Vec::with_capacity(96);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.push(b'"');
    let start = out.len();
    serde_json::to_writer(&mut out, body).expect("frames always serialise");
    assert_eq!(out.get(start), Some(&b'{'), "a frame body is a JSON object");
    if out.len() - start == 2 {
        // `{}`: no fields.
        out.truncate(start);
        out.push(b'}');
    } else {
        out[start] = b',';
    }
    out
}

/// Encode a `message` frame. Called once per message at append; the bytes are
/// stored and shared with every subscriber, never re-encoded.
pub fn encode_message_frame(
    channel: &ChannelName,
    seq: Option<u64>,
    id: &str,
    ts: u64,
    data: &RawValue,
    meta: Option<&Meta>,
) -> Vec<u8> {
    encode_frame(FrameKind::Message, channel, seq, id, ts, data, meta)
}

/// Encode a frame of any [`FrameKind`]: `type`, `channel`, `seq` (durable
/// only), `id`, `ts`, the body under [`FrameKind::body_field`], `meta`.
pub fn encode_frame(
    kind: FrameKind,
    channel: &ChannelName,
    seq: Option<u64>,
    id: &str,
    ts: u64,
    body: &RawValue,
    meta: Option<&Meta>,
) -> Vec<u8> {
    // Written directly rather than through serde_json's serializer: every
    // message is encoded once, and serde_json checks each byte of each key
    // and string for escapes (a tenth of a volatile publish's instructions,
    // `bench/callgrind.sh`). Same bytes (the tests compare with serde_json).
    // Sized once: the fixed fields take under 128 bytes besides the channel
    // and the body (meta, when present, may still grow it).
    let mut out = Vec::with_capacity(128 + channel.as_str().len() + id.len() + body.get().len());
    out.extend_from_slice(b"{\"type\":\"");
    // Frame kinds are lowercase ASCII words: nothing to escape.
    out.extend_from_slice(kind.as_str().as_bytes());
    out.extend_from_slice(b"\",\"channel\":");
    push_str(&mut out, channel.as_str());
    if let Some(seq) = seq {
        out.extend_from_slice(b",\"seq\":");
        push_u64(&mut out, seq);
    }
    out.extend_from_slice(b",\"id\":");
    push_str(&mut out, id);
    out.extend_from_slice(b",\"ts\":");
    push_u64(&mut out, ts);
    out.extend_from_slice(b",\"");
    out.extend_from_slice(kind.body_field().as_bytes());
    out.extend_from_slice(b"\":");
    out.extend_from_slice(body.get().as_bytes());
    if let Some(meta) = meta {
        out.extend_from_slice(b",\"meta\":");
        serde_json::to_writer(&mut out, meta).expect("meta always serialises");
    }
    out.push(b'}');
    out
}

/// `{"type":"unsubscribed","channel":...,"reason":...}`: the server ended a
/// subscription (for example `room_closed`); the connection stays open.
pub fn encode_unsubscribed(channel: &ChannelName, reason: &str) -> Vec<u8> {
    #[derive(Serialize)]
    struct Unsubscribed<'a> {
        channel: &'a str,
        reason: &'a str,
    }
    encode_tagged("unsubscribed", &Unsubscribed { channel: channel.as_str(), reason })
}

/// A stored `message` frame marked as a redelivery: `"redelivered":true` and
/// the delivery `attempt` (2 for the first redelivery) are added. Only the
/// rare redelivery path pays for this copy; first deliveries share the
/// stored bytes.
pub fn mark_redelivered(frame: &[u8], attempt: u32) -> Vec<u8> {
    // Frames are JSON objects encoded by `encode_message_frame`: they end
    // with `}` and have at least one field before it.
    let body = frame.strip_suffix(b"}").unwrap_or(frame);
    let mut out = Vec::with_capacity(frame.len() + 40);
    out.extend_from_slice(body);
    out.extend_from_slice(format!(",\"redelivered\":true,\"attempt\":{attempt}}}").as_bytes());
    out
}

/// The fields of a stored frame (`message` or `room`) that the history
/// endpoint serves, borrowed from the stored bytes: `data` is the exact
/// text inside the frame, never re-parsed into a value. Unknown fields
/// (`channel`, `member`) are skipped. Serialised, it is one message of a
/// history page, `data` written back byte for byte.
#[derive(Debug, Serialize, Deserialize)]
pub struct StoredFrame<'a> {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub seq: Option<u64>,
    pub id: String,
    pub ts: u64,
    /// `Some` whenever the frame has the field, `null` included.
    #[serde(default, borrow, deserialize_with = "present_raw")]
    pub data: Option<&'a RawValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Meta>,
}

impl<'a> StoredFrame<'a> {
    /// Read a frame made by [`encode_frame`]. A stored value that does not
    /// read is corruption: an error for the caller, never a panic.
    pub fn parse(frame: &'a [u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(frame)
    }
}

/// Any server frame, read back (by clients).
/// Fields absent from a frame type are `None`.
#[derive(Debug, Clone, Deserialize)]
pub struct MessageView {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub req: Option<u64>,
    #[serde(default)]
    pub channel: Option<String>,
    #[serde(default)]
    pub seq: Option<u64>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub ts: Option<u64>,
    /// `Some` whenever the frame has the field, `null` included.
    #[serde(default, deserialize_with = "present_raw_owned")]
    pub data: Option<Box<RawValue>>,
    #[serde(default)]
    pub meta: Option<Meta>,
    /// `join` and `leave` frames.
    #[serde(default)]
    pub member: Option<Member>,
    /// Presence replies.
    #[serde(default)]
    pub members: Option<Vec<Member>>,
    #[serde(default)]
    pub count: Option<u64>,
    #[serde(default)]
    pub client_id: Option<String>,
    #[serde(default)]
    pub epoch: Option<String>,
    #[serde(default)]
    pub first: Option<u64>,
    #[serde(default)]
    pub head: Option<u64>,
    #[serde(default)]
    pub truncated: Option<bool>,
    #[serde(default)]
    pub epoch_changed: Option<bool>,
    #[serde(default)]
    pub cursor: Option<u64>,
    #[serde(default)]
    pub unread: Option<u64>,
    #[serde(default)]
    pub since: Option<u64>,
    #[serde(default)]
    pub redelivered: Option<bool>,
    #[serde(default)]
    pub attempt: Option<u32>,
    #[serde(default)]
    pub duplicate: Option<bool>,
    #[serde(default)]
    pub code: Option<serde_json::Value>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub reconnect: Option<bool>,
}

impl MessageView {
    pub fn parse(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}
