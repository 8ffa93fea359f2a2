//! WebSocket frames. Client frames are parsed through a flat struct first so
//! a malformed frame gets a precise error (and so `data` can stay raw JSON,
//! which serde cannot do inside an internally tagged enum).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::{ChannelName, ErrorCode};

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

/// A frame from a client.
#[derive(Debug)]
pub enum ClientFrame {
    Subscribe {
        req: Option<u64>,
        channel: ChannelName,
        since: Option<Since>,
    },
    Unsubscribe {
        req: Option<u64>,
        channel: ChannelName,
    },
    Publish {
        req: Option<u64>,
        channel: ChannelName,
        data: Box<RawValue>,
        meta: Option<Meta>,
        idempotency_key: Option<String>,
    },
    Ack {
        req: Option<u64>,
        channel: ChannelName,
        seq: u64,
    },
    Presence {
        req: Option<u64>,
        channel: ChannelName,
    },
    Ping {
        req: Option<u64>,
    },
}

/// Why a client frame was rejected; `req` is echoed when it could be read.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ClientFrameError {
    pub req: Option<u64>,
    pub code: ErrorCode,
    pub message: String,
}

#[derive(Deserialize)]
struct RawClientFrame {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    req: Option<u64>,
    #[serde(default)]
    channel: Option<String>,
    #[serde(default)]
    since: Option<Since>,
    #[serde(default)]
    data: Option<Box<RawValue>>,
    #[serde(default)]
    meta: Option<Meta>,
    #[serde(default)]
    idempotency_key: Option<String>,
    #[serde(default)]
    seq: Option<u64>,
}

impl ClientFrame {
    /// The request number, if the client gave one.
    pub fn req(&self) -> Option<u64> {
        match self {
            ClientFrame::Subscribe { req, .. }
            | ClientFrame::Unsubscribe { req, .. }
            | ClientFrame::Publish { req, .. }
            | ClientFrame::Ack { req, .. }
            | ClientFrame::Presence { req, .. }
            | ClientFrame::Ping { req } => *req,
        }
    }

    /// Parse one text frame.
    pub fn parse(text: &str) -> Result<Self, ClientFrameError> {
        let raw: RawClientFrame = serde_json::from_str(text).map_err(|e| {
            // Recover `req` for the error reply when the frame is JSON but wrong.
            let req = serde_json::from_str::<serde_json::Value>(text)
                .ok()
                .and_then(|v| v.get("req").and_then(|r| r.as_u64()));
            let code = if e.is_syntax() || e.is_eof() { ErrorCode::BadJson } else { ErrorCode::BadRequest };
            ClientFrameError { req, code, message: format!("invalid frame: {e}") }
        })?;
        let req = raw.req;
        let err = |code, message: String| ClientFrameError { req, code, message };
        let channel = || -> Result<ChannelName, ClientFrameError> {
            let name = raw
                .channel
                .as_deref()
                .ok_or_else(|| err(ErrorCode::BadRequest, format!("`{}` needs `channel`", raw.kind)))?;
            ChannelName::new(name).map_err(|e| err(ErrorCode::BadChannel, e.to_string()))
        };
        Ok(match raw.kind.as_str() {
            "subscribe" => ClientFrame::Subscribe { req, channel: channel()?, since: raw.since.clone() },
            "unsubscribe" => ClientFrame::Unsubscribe { req, channel: channel()? },
            "publish" => {
                let channel = channel()?;
                let data =
                    raw.data.ok_or_else(|| err(ErrorCode::BadRequest, "`publish` needs `data`".into()))?;
                if let Some(meta) = &raw.meta {
                    validate_meta(meta).map_err(|m| err(ErrorCode::BadRequest, m))?;
                }
                ClientFrame::Publish {
                    req,
                    channel,
                    data,
                    meta: raw.meta,
                    idempotency_key: raw.idempotency_key,
                }
            }
            "ack" => {
                let channel = channel()?;
                let seq = raw.seq.ok_or_else(|| err(ErrorCode::BadRequest, "`ack` needs `seq`".into()))?;
                ClientFrame::Ack { req, channel, seq }
            }
            "presence" => ClientFrame::Presence { req, channel: channel()? },
            "ping" => ClientFrame::Ping { req },
            other => {
                return Err(err(ErrorCode::BadRequest, format!("unknown frame type `{other}`")));
            }
        })
    }
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
    /// Publish: assigned seq (absent for volatile channels).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// Publish: message id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Publish: the idempotency key matched an earlier publish.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate: Option<bool>,
}

impl OkFrame {
    pub fn encode(&self) -> Vec<u8> {
        encode_tagged("ok", self)
    }
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

fn encode_tagged<T: Serialize>(kind: &'static str, body: &T) -> Vec<u8> {
    #[derive(Serialize)]
    struct Tagged<'a, T> {
        #[serde(rename = "type")]
        kind: &'static str,
        #[serde(flatten)]
        body: &'a T,
    }
    serde_json::to_vec(&Tagged { kind, body }).expect("frames always serialise")
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
    #[derive(Serialize)]
    struct Msg<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        channel: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        seq: Option<u64>,
        id: &'a str,
        ts: u64,
        data: &'a RawValue,
        #[serde(skip_serializing_if = "Option::is_none")]
        meta: Option<&'a Meta>,
    }
    let msg = Msg { kind: "message", channel: channel.as_str(), seq, id, ts, data, meta };
    serde_json::to_vec(&msg).expect("messages always serialise")
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

/// Any server frame, read back (by clients and the HTTP history endpoint).
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
    #[serde(default)]
    pub data: Option<Box<RawValue>>,
    #[serde(default)]
    pub meta: Option<Meta>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_client_frame() {
        let f = ClientFrame::parse(
            r#"{"type":"subscribe","req":1,"channel":"chat:1","since":{"seq":3,"epoch":"E"}}"#,
        )
        .unwrap();
        match f {
            ClientFrame::Subscribe { req, channel, since } => {
                assert_eq!(req, Some(1));
                assert_eq!(channel.as_str(), "chat:1");
                assert_eq!(since, Some(Since { seq: 3, epoch: Some("E".into()) }));
            }
            other => panic!("{other:?}"),
        }
        let f = ClientFrame::parse(
            r#"{"type":"publish","req":3,"channel":"chat:1","data":{"a":[1, 2]},"idempotency_key":"k1"}"#,
        )
        .unwrap();
        match f {
            ClientFrame::Publish { data, idempotency_key, .. } => {
                assert_eq!(data.get(), r#"{"a":[1, 2]}"#, "data is kept raw, byte for byte");
                assert_eq!(idempotency_key.as_deref(), Some("k1"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            ClientFrame::parse(r#"{"type":"ping","req":4}"#),
            Ok(ClientFrame::Ping { req: Some(4) })
        ));
        assert!(matches!(
            ClientFrame::parse(r#"{"type":"ack","channel":"user:1","seq":15}"#),
            Ok(ClientFrame::Ack { seq: 15, .. })
        ));
    }

    #[test]
    fn errors_are_precise_and_echo_req() {
        let e = ClientFrame::parse("{not json").unwrap_err();
        assert_eq!(e.code, ErrorCode::BadJson);
        let e = ClientFrame::parse(r#"{"type":"subscribe","req":9}"#).unwrap_err();
        assert_eq!((e.code, e.req), (ErrorCode::BadRequest, Some(9)));
        let e = ClientFrame::parse(r#"{"type":"subscribe","req":9,"channel":"a b"}"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::BadChannel);
        let e = ClientFrame::parse(r#"{"type":"frobnicate","req":2}"#).unwrap_err();
        assert_eq!((e.code, e.req), (ErrorCode::BadRequest, Some(2)));
        let e = ClientFrame::parse(r#"{"type":"publish","req":5,"channel":"chat:1","data":1,"req":"x"}"#);
        assert!(e.is_err());
    }

    #[test]
    fn message_frame_round_trips() {
        let ch = ChannelName::new("chat:1").unwrap();
        let data = RawValue::from_string(r#"{"text":"hi"}"#.into()).unwrap();
        let mut meta = Meta::new();
        meta.insert("trace_id".into(), "t1".into());
        let bytes = encode_message_frame(&ch, Some(4), "id-1", 1700, &data, Some(&meta));
        let v = MessageView::parse(&bytes).unwrap();
        assert_eq!(v.kind, "message");
        assert_eq!(v.seq, Some(4));
        assert_eq!(v.data.unwrap().get(), r#"{"text":"hi"}"#);
        assert_eq!(v.meta.unwrap()["trace_id"], "t1");
    }

    #[test]
    fn redelivered_frames_keep_every_field_and_add_the_marker() {
        let ch = ChannelName::new("user:1").unwrap();
        let data = RawValue::from_string(r#"{"n":1}"#.into()).unwrap();
        let frame = encode_message_frame(&ch, Some(7), "id-7", 5, &data, None);
        let v = MessageView::parse(&mark_redelivered(&frame, 3)).unwrap();
        assert_eq!((v.seq, v.redelivered, v.attempt), (Some(7), Some(true), Some(3)));
        assert_eq!(v.data.unwrap().get(), r#"{"n":1}"#);
    }

    #[test]
    fn ok_frame_omits_irrelevant_fields() {
        let ok = OkFrame { req: Some(1), seq: Some(8), duplicate: Some(false), ..Default::default() };
        assert_eq!(
            String::from_utf8(ok.encode()).unwrap(),
            r#"{"type":"ok","req":1,"seq":8,"duplicate":false}"#
        );
    }
}
