//! HTTP publish bodies (`POST /api/v1/channels/{channel}/messages` and
//! `POST /api/v1/publish`): parsed here once, for the server and the fuzzer.
//! `data` stays raw JSON; the rules of [`crate::check_data`] are applied by
//! the server's publish path, shared with socket publishes.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::{validate_meta, ErrorCode, Meta, StoredFrame};

/// Why a body was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BodyError {
    pub code: ErrorCode,
    pub message: String,
}

/// `{"data": <any JSON>, "meta": {...}}`; unknown fields are refused.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishBody {
    pub data: Box<RawValue>,
    #[serde(default)]
    pub meta: Option<Meta>,
    /// Scheduled delivery: append at this time (ms since the Unix epoch).
    #[serde(default)]
    pub deliver_at: Option<u64>,
    /// Scheduled delivery: append this many ms from now.
    #[serde(default)]
    pub delay_ms: Option<u64>,
}

/// `{"channels": [...], "data": <any JSON>, "meta": {...}}`; unknown fields
/// are refused. Channel names are checked by the caller, which knows the
/// namespaces and the batch limit.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchBody {
    pub channels: Vec<String>,
    pub data: Box<RawValue>,
    #[serde(default)]
    pub meta: Option<Meta>,
    /// As in [`PublishBody`].
    #[serde(default)]
    pub deliver_at: Option<u64>,
    #[serde(default)]
    pub delay_ms: Option<u64>,
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
}
