//! HTTP API response bodies (`/api/v1`), defined once: the server
//! serialises them, the Rust client and the bench read them back. Errors
//! are problem documents ([`crate::Problem`]); a failed batch publish adds
//! its per-channel outcome ([`BatchProblem`]). Message `data` is never
//! parsed into a value: pages carry it as raw JSON text, byte for byte.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::{Member, Meta, Problem};

/// A room's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoomStatus {
    /// Created; the host has not been present yet.
    Open,
    /// The host is present.
    Live,
    /// The host's lease was lost; the room closes at `grace_until_ms`
    /// unless the host comes back.
    Grace,
    /// Final: no more messages, no members.
    Closed,
}

impl RoomStatus {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Live => "live",
            Self::Grace => "grace",
            Self::Closed => "closed",
        }
    }

    /// Whether `self → to` is a legal transition. Staying in a state is
    /// legal except for `closed` (a closed room takes no changes at all).
    pub fn can_become(self, to: RoomStatus) -> bool {
        use RoomStatus::*;
        match (self, to) {
            (Closed, _) => false,
            (a, b) if a == b => true,
            (Open, Live) | (Open, Closed) => true,
            (Live, Grace) | (Live, Closed) => true,
            (Grace, Live) | (Grace, Closed) => true,
            _ => false,
        }
    }
}

impl std::fmt::Display for RoomStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `201`/`202` reply to a publish, and one success of a batch: where the
/// message went. `seq` is absent on volatile channels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    pub channel: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<String>,
}

/// One channel's outcome in a batch publish: the fields of [`Published`]
/// on success, `error` otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchItem {
    pub channel: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ItemError>,
}

impl From<Published> for BatchItem {
    fn from(p: Published) -> Self {
        Self { channel: p.channel, seq: p.seq, id: Some(p.id), epoch: p.epoch, error: None }
    }
}

/// Why one channel of a batch failed: a stable code and a detail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemError {
    pub code: String,
    pub detail: String,
}

/// `POST /api/v1/publish` on success: `{"results": [...]}`, in the order
/// of the request's `channels`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchReply {
    pub results: Vec<BatchItem>,
}

/// `POST /api/v1/publish` when a channel failed: the problem document of
/// the first failure plus every channel's outcome, so the caller knows what
/// landed (a retry with the same key completes the rest).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BatchProblem {
    #[serde(flatten)]
    pub problem: Problem,
    pub results: Vec<BatchItem>,
}

/// `GET /api/v1/channels/{channel}/messages`, read back: the encoding side
/// is [`crate::HistoryPage`], which writes stored frames straight to bytes.
#[derive(Debug, Clone, Deserialize)]
pub struct History {
    pub channel: String,
    #[serde(default)]
    pub epoch: Option<String>,
    #[serde(default)]
    pub first: u64,
    #[serde(default)]
    pub head: u64,
    pub messages: Vec<HistoryMessage>,
}

/// One message of a [`History`] page; `data` as the publisher sent it.
#[derive(Debug, Clone, Deserialize)]
pub struct HistoryMessage {
    pub seq: u64,
    pub id: String,
    pub ts: u64,
    pub data: Box<RawValue>,
    #[serde(default)]
    pub meta: Option<Meta>,
}

/// `GET /api/v1/channels/{channel}/cursors`: delivery receipts of an acked
/// channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CursorsPage {
    pub channel: String,
    #[serde(default)]
    pub epoch: String,
    #[serde(default)]
    pub first: u64,
    pub head: u64,
    pub cursors: Vec<SubscriberCursor>,
}

/// One subscriber's ack cursor (highest acked seq) on a channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriberCursor {
    pub user: String,
    /// `null` for a subscriber without a device.
    #[serde(default)]
    pub device: Option<String>,
    pub cursor: u64,
    #[serde(default)]
    pub unread: u64,
    /// Milliseconds since the Unix epoch.
    #[serde(default)]
    pub acked_at: u64,
}

/// `GET /api/v1/users/{user}/inbox`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inbox {
    pub user: String,
    pub channels: Vec<InboxChannel>,
}

/// One acked channel of an [`Inbox`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxChannel {
    pub channel: String,
    pub epoch: String,
    pub first: u64,
    pub head: u64,
    /// What a device that never acked has unread: everything retained.
    pub unread_without_cursor: u64,
    pub devices: Vec<InboxDevice>,
}

/// One device's ack cursor in an [`InboxChannel`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxDevice {
    /// `null` for the user's cursor without a device.
    pub device: Option<String>,
    pub cursor: u64,
    pub acked_at: u64,
    pub unread: u64,
}

/// `GET /api/v1/channels/{channel}/presence`: `members` is absent with
/// `count=1`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PresenceReply {
    pub channel: String,
    pub count: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<Vec<Member>>,
}

/// A room as the API shows it (`/api/v1/rooms/{room}`, and the `current`
/// of a 409/412 problem, where the members are left out).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoomView {
    pub room: String,
    pub state: RoomStatus,
    pub version: u64,
    pub host: String,
    pub attributes: serde_json::Map<String, serde_json::Value>,
    /// Seconds.
    pub grace_period: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_until_ms: Option<u64>,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_count: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<Vec<Member>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    #[test]
    fn batch_items_and_problems_keep_their_shape() {
        let ok = BatchItem::from(Published {
            channel: "chat:1".into(),
            seq: Some(3),
            id: "i".into(),
            epoch: Some("E".into()),
        });
        assert_eq!(
            serde_json::to_string(&ok).unwrap(),
            r#"{"channel":"chat:1","seq":3,"id":"i","epoch":"E"}"#
        );
        let failed = BatchItem {
            channel: "chat:2".into(),
            seq: None,
            id: None,
            epoch: None,
            error: Some(ItemError { code: "unavailable".into(), detail: "d".into() }),
        };
        let p =
            BatchProblem { problem: Problem::new(ErrorCode::Unavailable, "d"), results: vec![ok, failed] };
        let v: serde_json::Value = serde_json::to_value(&p).unwrap();
        assert_eq!((v["code"].as_str(), v["status"].as_u64()), (Some("unavailable"), Some(503)));
        assert_eq!(v["results"][1]["error"]["code"], "unavailable");
        let back: BatchProblem = serde_json::from_value(v).unwrap();
        assert_eq!(back.results, p.results);
    }

    #[test]
    fn history_pages_read_back_data_raw() {
        let page = r#"{"channel":"c:1","epoch":"E","first":1,"head":1,
            "messages":[{"type":"message","seq":1,"id":"i","ts":2,"data":{ "b":1e400 }}]}"#;
        let h: History = serde_json::from_str(page).unwrap();
        assert_eq!(h.messages[0].data.get(), r#"{ "b":1e400 }"#);
    }

    #[test]
    fn room_statuses_move_only_forward_to_closed() {
        assert!(RoomStatus::Open.can_become(RoomStatus::Live));
        assert!(!RoomStatus::Closed.can_become(RoomStatus::Closed));
        assert_eq!(serde_json::to_string(&RoomStatus::Grace).unwrap(), r#""grace""#);
    }
}
