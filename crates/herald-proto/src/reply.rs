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

impl Published {
    /// The JSON of a `Published` with these fields, byte for byte what
    /// serde_json writes for it, written directly from borrowed parts:
    /// every HTTP publish is answered with one (see
    /// [`encode_frame`](crate::encode_frame) for why not through serde_json).
    pub fn encode_parts(channel: &str, seq: Option<u64>, id: &str, epoch: Option<&str>) -> Vec<u8> {
        use crate::frame::server::{push_placement, push_str};
        let mut out = Vec::with_capacity(64 + channel.len() + id.len() + epoch.map_or(0, str::len));
        out.push(b'{');
        push_placement(&mut out, channel, seq, id);
        if let Some(epoch) = epoch {
            out.extend_from_slice(b",\"epoch\":");
            push_str(&mut out, epoch);
        }
        out.push(b'}');
        out
    }
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
    /// Users removed from the room (`DELETE /api/v1/rooms/{room}/members/{user}`):
    /// their subscribes to it are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
}

/// `202` reply to a scheduled publish (and one entry of a scheduled batch):
/// the schedule's id and when its message is appended, ms since the Unix
/// epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduledReceipt {
    pub scheduled_id: String,
    pub channel: String,
    pub deliver_at: u64,
}

/// `202` reply to a scheduled `POST /api/v1/publish`: one receipt per
/// channel, in the order of the request's `channels`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduledBatchReply {
    pub results: Vec<ScheduledReceipt>,
}

/// `200` reply to `POST /api/v1/messages`: one result per message, in the
/// order of the request's `messages`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessagesReply {
    pub results: Vec<MessageResult>,
}

/// What became of one message of `POST /api/v1/messages`. `replayed`:
/// the answer comes from the receipt of an earlier request under the
/// message's `idempotency_key`; nothing was appended or scheduled again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageResult {
    /// Scheduled: the fields of a [`ScheduledReceipt`].
    Scheduled {
        scheduled_id: String,
        channel: String,
        deliver_at: u64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        replayed: bool,
    },
    /// Refused or failed: nothing of this message was appended or
    /// scheduled. `channel` as the request named it.
    Failed { channel: String, error: ItemError },
    /// Appended (or broadcast, on a volatile channel): the fields of
    /// [`Published`].
    Published {
        channel: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seq: Option<u64>,
        id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        epoch: Option<String>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        replayed: bool,
    },
    /// A message to several channels (`channels`): one result per channel,
    /// in the order named, each one of the other three.
    Channels { results: Vec<MessageResult> },
}

impl MessageResult {
    /// Whether the message was refused or failed (on some channel, for a
    /// message to several).
    pub fn is_error(&self) -> bool {
        match self {
            Self::Failed { .. } => true,
            Self::Channels { results } => results.iter().any(Self::is_error),
            Self::Scheduled { .. } | Self::Published { .. } => false,
        }
    }

    /// Whether the answer is a replay of an earlier request's (on every
    /// channel, for a message to several).
    pub fn is_replayed(&self) -> bool {
        match self {
            Self::Scheduled { replayed, .. } | Self::Published { replayed, .. } => *replayed,
            Self::Channels { results } => results.iter().all(Self::is_replayed),
            Self::Failed { .. } => false,
        }
    }
}

/// A pending schedule (`GET /api/v1/scheduled`, and the reply to its
/// `DELETE`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduledEntry {
    pub id: String,
    pub channel: String,
    /// ms since the Unix epoch.
    pub deliver_at: u64,
    pub created_at: u64,
    /// Bytes of `data`.
    pub size: u64,
}

/// `GET /api/v1/scheduled?channel=C`: the channel's pending schedules, in
/// delivery order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduledList {
    pub channel: String,
    pub scheduled: Vec<ScheduledEntry>,
}

/// `GET /api/v1/webhooks`: the delivery status of every configured webhook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhooksStatus {
    pub webhooks: Vec<WebhookStatus>,
}

/// One webhook: its total lag, how many channels are stalled, and every
/// channel with undelivered messages or a failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookStatus {
    pub name: String,
    pub lag: u64,
    pub stalled: u64,
    pub channels: Vec<WebhookChannelStatus>,
}

/// One channel of a webhook. `null` fields are written out, not left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookChannelStatus {
    pub channel: String,
    /// The last seq the backend acknowledged.
    pub cursor: u64,
    pub head: u64,
    pub lag: u64,
    pub oldest_undelivered_age_ms: Option<u64>,
    /// The last failure seen by the node that answers.
    pub last_error: Option<WebhookError>,
    /// Undelivered messages retention removed already.
    pub overtaken: u64,
    /// Failing, or overtaken by retention.
    pub stalled: bool,
}

/// A failed webhook request: when (ms since the Unix epoch), its class
/// (`timeout`, `connect`, `status`, ...) and a detail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookError {
    pub at: u64,
    pub class: String,
    pub message: String,
}

/// `POST /api/v1/webhooks/{name}/channels/{channel}/skip`: the seq skipped
/// (`null`: nothing was undelivered) and the cursor after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookSkipped {
    pub channel: String,
    pub skipped: Option<u64>,
    pub cursor: u64,
}

/// `POST /api/v1/webhooks/{name}/channels/{channel}/retry` (`202`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookRetrying {
    pub channel: String,
    pub retrying: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    #[test]
    fn published_replies_are_the_bytes_serde_json_writes() {
        let odd = ["", "quote\" back\\slash", "tab\tnewline\n\u{1} del\u{7f}", "é ✓ 𝄞"];
        for channel in ["chat:1", "live:a.b-c_d@e=f"].into_iter().chain(odd) {
            for id in ["0190b2a1-7c3e-7000-8000-000000000001"].into_iter().chain(odd) {
                for seq in [None, Some(0), Some(u64::MAX)] {
                    for epoch in [None, Some("e1f2"), Some(odd[1]), Some(odd[3])] {
                        let reply = Published {
                            channel: channel.into(),
                            seq,
                            id: id.into(),
                            epoch: epoch.map(str::to_owned),
                        };
                        let expected = serde_json::to_string(&reply).unwrap();
                        let got = Published::encode_parts(channel, seq, id, epoch);
                        assert_eq!(String::from_utf8(got).unwrap(), expected);
                    }
                }
            }
        }
    }

    #[test]
    fn webhook_status_writes_its_nulls_and_reads_back() {
        let ch = WebhookChannelStatus {
            channel: "orders:1".into(),
            cursor: 4,
            head: 4,
            lag: 0,
            oldest_undelivered_age_ms: None,
            last_error: None,
            overtaken: 0,
            stalled: false,
        };
        let text = serde_json::to_string(&ch).unwrap();
        assert!(text.contains(r#""oldest_undelivered_age_ms":null"#), "{text}");
        assert!(text.contains(r#""last_error":null"#), "{text}");
        assert_eq!(serde_json::from_str::<WebhookChannelStatus>(&text).unwrap(), ch);
        let skipped =
            serde_json::to_string(&WebhookSkipped { channel: "c".into(), skipped: None, cursor: 0 }).unwrap();
        assert_eq!(skipped, r#"{"channel":"c","skipped":null,"cursor":0}"#);
    }

    #[test]
    fn scheduled_receipts_keep_their_field_names() {
        let r = ScheduledReceipt { scheduled_id: "s1".into(), channel: "c".into(), deliver_at: 5 };
        let text = serde_json::to_string(&ScheduledBatchReply { results: vec![r.clone()] }).unwrap();
        assert_eq!(text, r#"{"results":[{"scheduled_id":"s1","channel":"c","deliver_at":5}]}"#);
        assert_eq!(serde_json::from_str::<ScheduledBatchReply>(&text).unwrap().results, vec![r]);
    }

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

    #[test]
    fn message_results_read_back_as_the_variant_written() {
        let results = vec![
            MessageResult::Published {
                channel: "a:1".into(),
                seq: Some(3),
                id: "m".into(),
                epoch: Some("e".into()),
                replayed: true,
            },
            MessageResult::Published {
                channel: "v:1".into(),
                seq: None,
                id: "n".into(),
                epoch: None,
                replayed: false,
            },
            MessageResult::Scheduled {
                scheduled_id: "s".into(),
                channel: "a:2".into(),
                deliver_at: 9,
                replayed: false,
            },
            MessageResult::Failed {
                channel: "bad".into(),
                error: ItemError { code: "bad_channel".into(), detail: "d".into() },
            },
        ];
        let text = serde_json::to_string(&MessagesReply { results: results.clone() }).unwrap();
        assert!(!text.contains("\"replayed\":false"), "{text}");
        assert_eq!(serde_json::from_str::<MessagesReply>(&text).unwrap().results, results);
    }
}

/// `GET /api/v1/consumers`: every configured outbox consumer as the node
/// that answers sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumersStatus {
    pub consumers: Vec<ConsumerStatus>,
}

/// One consumer: its kind, what this node published and parked since it
/// started, and every partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerStatus {
    pub name: String,
    /// `postgres` or `redis-stream`.
    pub kind: String,
    pub published: u64,
    pub parked: u64,
    pub partitions: Vec<ConsumerPartitionStatus>,
}

/// One partition. `lag`, `parked_rows`, `last_id` and `token` are known
/// only on the node that owns (or owned) it; `null` elsewhere.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerPartitionStatus {
    pub partition: u32,
    /// This node owns the partition now.
    pub owned: bool,
    /// Its fencing token while owned.
    pub token: Option<u64>,
    /// Rows (entries) due and waiting in the source at the owner's last look.
    pub lag: Option<u64>,
    /// Rows scheduled for later (a future `deliver_at`) at the owner's last
    /// look; `null` for a table without `deliver_at` and for a stream.
    #[serde(default)]
    pub scheduled_rows: Option<u64>,
    /// The greatest source id this node published and removed.
    pub last_id: Option<String>,
    /// Parked rows of this partition at the owner's last look.
    pub parked_rows: Option<u64>,
    /// The last failure of this partition on this node, cleared on recovery.
    pub last_error: Option<ConsumerError>,
}

/// A consumer's failure: when (ms) and what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerError {
    pub at: u64,
    pub message: String,
}

/// `GET /api/v1/consumers/{name}/parked`: rows that could not be
/// published, oldest id first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParkedRows {
    pub consumer: String,
    pub rows: Vec<ParkedRow>,
}

/// One parked row: its id in the outbox, its channel, the error code and
/// detail that refused it, when it was parked (ms).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParkedRow {
    pub id: i64,
    pub channel: Option<String>,
    /// The row's `channels`, when the outbox has that column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<Vec<Option<String>>>,
    pub code: String,
    pub error: String,
    pub parked_at: u64,
}

/// `POST /api/v1/consumers/{name}/parked/{id}/retry`: the row is back in
/// the outbox under `new_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParkedRetried {
    pub id: i64,
    pub new_id: i64,
}
