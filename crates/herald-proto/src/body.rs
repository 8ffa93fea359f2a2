//! HTTP request bodies and query strings: publish
//! (`POST /api/v1/channels/{channel}/messages`, `POST /api/v1/publish` and
//! `POST /api/v1/messages`),
//! rooms (`PUT`/`PATCH /api/v1/rooms/{room}`), and the queries of history,
//! cursors and presence. Parsed here once, for the server and the fuzzer;
//! clients encode the same types. `data` stays raw JSON; the rules of
//! [`crate::check_data`] are applied by the server's publish path, shared
//! with socket publishes.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::{validate_meta, ErrorCode, Meta, RoomStatus, StoredFrame};

/// Why a body was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BodyError {
    pub code: ErrorCode,
    pub message: String,
}

/// A request body the server reads whole and parses with one call; the
/// server's body extractor takes any of these.
pub trait RequestBody: Sized {
    fn parse(body: &[u8]) -> Result<Self, BodyError>;
}

/// `{"data": <any JSON>, "meta": {...}}`; unknown fields are refused.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PublishBody {
    pub data: Box<RawValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Meta>,
    /// Scheduled delivery: append at this time (ms since the Unix epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver_at: Option<u64>,
    /// Scheduled delivery: append this many ms from now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
}

/// `{"channels": [...], "data": <any JSON>, "meta": {...}}`; unknown fields
/// are refused. Channel names are checked by the caller, which knows the
/// namespaces and the batch limit.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BatchBody {
    pub channels: Vec<String>,
    pub data: Box<RawValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Meta>,
    /// As in [`PublishBody`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
}

/// `POST /api/v1/messages`: `{"messages": [...]}`, several messages
/// published in one request, each on its own. Unknown fields, here or in
/// a message, refuse the whole request (it is malformed, not one bad
/// message); everything else is checked per message by the server.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MessagesBody {
    pub messages: Vec<MessageItem>,
}

/// One message of a [`MessagesBody`]: what `POST
/// /api/v1/channels/{channel}/messages` takes in its path, header and
/// body, in one object; or, with `channels` instead of `channel`, what
/// `POST /api/v1/publish` takes (one message to several channels). Exactly
/// one of the two is given.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MessageItem {
    /// The one channel (empty when `channels` names them).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub channel: String,
    /// Several channels, each appended the same message (empty when
    /// `channel` names one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub channels: Vec<String>,
    pub data: Box<RawValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Meta>,
    /// This message's key, scoped as an `Idempotency-Key` header is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// As in [`PublishBody`]: scheduled delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
}

/// A publish body to send, borrowed from the caller (the client side of
/// [`PublishBody`]): `data` is anything serialisable, a [`RawValue`] goes
/// out byte for byte.
#[derive(Debug, Serialize)]
pub struct PublishBodyRef<'a, D: ?Sized> {
    pub data: &'a D,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub meta: Option<&'a Meta>,
    /// As in [`PublishBody`]: scheduled delivery.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deliver_at: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
}

/// `PUT /api/v1/rooms/{room}`: create a room.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRoomBody {
    pub host: String,
    #[serde(default)]
    pub attributes: serde_json::Map<String, serde_json::Value>,
    /// Seconds; the namespace's `grace_period` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period: Option<u64>,
}

/// `PATCH /api/v1/rooms/{room}`: `{"state"?, "attributes"?}`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PatchRoomBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<RoomStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes: Option<serde_json::Map<String, serde_json::Value>>,
}

/// `GET /api/v1/channels/{channel}/messages?after=SEQ&limit=N`.
#[derive(Debug, Default, Deserialize, Serialize)]
pub struct HistoryQuery {
    #[serde(default)]
    pub after: u64,
    #[serde(default)]
    pub limit: Option<usize>,
}

/// `?limit=N` of the cursors and inbox endpoints.
#[derive(Debug, Default, Deserialize, Serialize)]
pub struct LimitQuery {
    #[serde(default)]
    pub limit: Option<usize>,
}

/// `GET /api/v1/scheduled?channel=C&limit=N` (`channel` is required; the
/// handler says so when it is missing).
#[derive(Debug, Default, Deserialize, Serialize)]
pub struct ScheduledQuery {
    #[serde(default)]
    pub channel: Option<String>,
    #[serde(default)]
    pub limit: Option<usize>,
}

/// `GET /api/v1/channels/{channel}/presence[?count=1][&limit=N]`.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PresenceQuery {
    /// `1`/`true`: only the count.
    #[serde(default)]
    pub count: Option<String>,
    #[serde(default)]
    pub limit: Option<usize>,
}

impl RequestBody for PublishBody {
    fn parse(body: &[u8]) -> Result<Self, BodyError> {
        PublishBody::parse(body)
    }
}

impl RequestBody for BatchBody {
    fn parse(body: &[u8]) -> Result<Self, BodyError> {
        BatchBody::parse(body)
    }
}

impl RequestBody for MessagesBody {
    fn parse(body: &[u8]) -> Result<Self, BodyError> {
        parse_json(body)
    }
}

impl RequestBody for CreateRoomBody {
    fn parse(body: &[u8]) -> Result<Self, BodyError> {
        parse_json(body)
    }
}

impl RequestBody for PatchRoomBody {
    fn parse(body: &[u8]) -> Result<Self, BodyError> {
        parse_json(body)
    }
}

impl PublishBody {
    pub fn parse(body: &[u8]) -> Result<Self, BodyError> {
        let b: Self = parse_json(body)?;
        check_meta(b.meta.as_ref())?;
        Ok(b)
    }
}

impl BatchBody {
    pub fn parse(body: &[u8]) -> Result<Self, BodyError> {
        let b: Self = parse_json(body)?;
        check_meta(b.meta.as_ref())?;
        Ok(b)
    }
}

/// `GET /api/v1/channels/{channel}/messages`: one page of a channel's log,
/// each message as stored (see [`StoredFrame`]). Serialised straight to
/// bytes, so every `data` is written as the publisher sent it.
#[derive(Debug, Serialize)]
pub struct HistoryPage<'a> {
    pub channel: &'a str,
    pub epoch: &'a str,
    pub first: u64,
    pub head: u64,
    pub messages: Vec<StoredFrame<'a>>,
}

impl HistoryPage<'_> {
    pub fn encode(&self) -> Vec<u8> {
        // Strings, integers and raw JSON text: nothing here can fail.
        serde_json::to_vec(self).expect("a history page serialises")
    }
}

/// Parse a JSON body: `bad_json` when it is not JSON, `bad_request` when it
/// is JSON of the wrong shape.
pub fn parse_json<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, BodyError> {
    serde_json::from_slice(bytes).map_err(|e| {
        let code = if e.is_syntax() || e.is_eof() { ErrorCode::BadJson } else { ErrorCode::BadRequest };
        BodyError { code, message: format!("invalid body: {e}") }
    })
}

fn check_meta(meta: Option<&Meta>) -> Result<(), BodyError> {
    match meta {
        Some(m) => validate_meta(m).map_err(|message| BodyError { code: ErrorCode::BadRequest, message }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_keep_data_raw_and_refuse_unknown_fields() {
        let b = PublishBody::parse(br#"{"data": {"b":1, "a":[1e400, 12345678901234567890123]} }"#).unwrap();
        assert_eq!(b.data.get(), r#"{"b":1, "a":[1e400, 12345678901234567890123]}"#);
        let e = PublishBody::parse(br#"{"data":1,"extra":2}"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::BadRequest);
        assert_eq!(PublishBody::parse(b"{\"data\":").unwrap_err().code, ErrorCode::BadJson);
        assert_eq!(PublishBody::parse(br#"{"data":1,"data":2}"#).unwrap_err().code, ErrorCode::BadRequest);
        let b = BatchBody::parse(br#"{"channels":["a:1"],"data":"x","meta":{"k":"v"}}"#).unwrap();
        assert_eq!((b.channels.len(), b.data.get()), (1, r#""x""#));
        let long = format!(r#"{{"channels":[],"data":1,"meta":{{"k":"{}"}}}}"#, "v".repeat(300));
        assert_eq!(BatchBody::parse(long.as_bytes()).unwrap_err().code, ErrorCode::BadRequest);
    }

    #[test]
    fn a_messages_body_keeps_each_data_raw_and_refuses_unknown_fields() {
        let b = <MessagesBody as RequestBody>::parse(
            br#"{"messages":[{"channel":"a:1","data":{"b":1, "a":2},"idempotency_key":"k"},
                {"channel":"a:2","data":3,"delay_ms":5}]}"#,
        )
        .unwrap();
        assert_eq!(b.messages[0].data.get(), r#"{"b":1, "a":2}"#);
        assert_eq!(b.messages[0].idempotency_key.as_deref(), Some("k"));
        assert_eq!(b.messages[1].delay_ms, Some(5));
        let e = <MessagesBody as RequestBody>::parse(br#"{"messages":[{"channel":"a:1","data":1,"x":2}]}"#);
        assert_eq!(e.unwrap_err().code, ErrorCode::BadRequest);
    }
}
