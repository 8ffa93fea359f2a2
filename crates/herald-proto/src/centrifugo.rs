//! The Centrifugo client protocol (v2, JSON encoding) as Herald speaks it on
//! `GET /connection/websocket`, so the centrifuge SDKs connect unchanged.
//!
//! Framing: a text frame holds one or more JSON objects separated by `\n`.
//! A client sends `Command`s (the method is the one field present:
//! `connect`, `subscribe`, ...; the reply echoes `id`); the server sends
//! `Reply`s (`id` + one result or `error`) and pushes (`{"push":{...}}`,
//! no `id`). An empty object is a ping from the server and the client's
//! pong. Every `\n` the server writes inside an object is JSON whitespace
//! (valid JSON strings hold no raw newline), so [`frame_safe`] turns it
//! into a space and the framing holds whatever the published `data` was.
//!
//! `bytes` fields of the protocol (publication `data`, member `info`) are
//! raw JSON in this encoding: written byte for byte.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::ErrorCode;

/// Numeric error codes of replies (`{"error":{"code":..}}`). SDKs retry a
/// code below 100 or an error marked `temporary`.
pub mod error_code {
    pub const INTERNAL: u32 = 100;
    pub const UNAUTHORIZED: u32 = 101;
    pub const UNKNOWN_CHANNEL: u32 = 102;
    pub const PERMISSION_DENIED: u32 = 103;
    pub const METHOD_NOT_FOUND: u32 = 104;
    pub const ALREADY_SUBSCRIBED: u32 = 105;
    pub const LIMIT_EXCEEDED: u32 = 106;
    pub const BAD_REQUEST: u32 = 107;
    pub const NOT_AVAILABLE: u32 = 108;
    pub const TOKEN_EXPIRED: u32 = 109;
    pub const EXPIRED: u32 = 110;
    pub const TOO_MANY_REQUESTS: u32 = 111;
    pub const UNRECOVERABLE_POSITION: u32 = 112;
}

/// WebSocket close codes. SDKs stop on 3500..=3999 and 4500..=4999 and
/// reconnect on the others; Herald's own 4000..=4099 codes are not used
/// on this endpoint.
pub mod disconnect {
    /// The server is shutting down: reconnect.
    pub const SHUTDOWN: u16 = 3001;
    /// An internal failure (storage unavailable): reconnect.
    pub const SERVER_ERROR: u16 = 3004;
    /// The token expired: reconnect with a fresh token.
    pub const EXPIRED: u16 = 3005;
    /// The outbox was full: reconnect and recover.
    pub const SLOW: u16 = 3008;
    /// The log lost what the client had (new epoch, trimmed): reconnect,
    /// the resubscribe answers `recovered: false`.
    pub const INSUFFICIENT_STATE: u16 = 3010;
    /// No pong (nothing read within `heartbeat.idle_timeout`): reconnect.
    pub const NO_PONG: u16 = 3012;
    /// The backend disconnected the connection and lets it reconnect
    /// (Centrifugo's "force reconnect").
    pub const FORCE_RECONNECT: u16 = 3011;
    /// The frame budget was exceeded: reconnect (after backoff).
    pub const TOO_MANY_REQUESTS: u16 = 3013;
    /// Bad or missing token: stop.
    pub const INVALID_TOKEN: u16 = 3500;
    /// A malformed command or a binary frame: stop.
    pub const BAD_REQUEST: u16 = 3501;
    /// The backend disconnected the connection for good, or refused it (a
    /// ban): stop (Centrifugo's "force no reconnect").
    pub const FORCE_NO_RECONNECT: u16 = 3503;
    /// A frame above `websocket.max_message_bytes` (the SDK stops on it).
    pub const MESSAGE_TOO_BIG: u16 = 1009;
}

/// The close code of this endpoint for one of Herald's (`crate::close`):
/// the same decision (reconnect or stop) in the SDKs' ranges.
pub const fn disconnect_of(herald: u16) -> u16 {
    use crate::close;
    match herald {
        close::GOING_AWAY | close::DRAINING => disconnect::SHUTDOWN,
        close::MESSAGE_TOO_BIG => disconnect::MESSAGE_TOO_BIG,
        close::BAD_REQUEST => disconnect::BAD_REQUEST,
        close::UNAUTHORIZED => disconnect::INVALID_TOKEN,
        close::TOKEN_EXPIRED => disconnect::EXPIRED,
        close::IDLE_TIMEOUT => disconnect::NO_PONG,
        close::RESYNC => disconnect::INSUFFICIENT_STATE,
        close::SLOW_CONSUMER => disconnect::SLOW,
        close::RATE_LIMITED => disconnect::TOO_MANY_REQUESTS,
        close::DISCONNECTED => disconnect::FORCE_RECONNECT,
        close::DISCONNECTED_FOR_GOOD => disconnect::FORCE_NO_RECONNECT,
        _ => disconnect::SERVER_ERROR,
    }
}

/// Unsubscribe push codes: below 2500 the SDK stays unsubscribed, from 2500
/// on it subscribes again.
pub mod unsubscribe_code {
    /// The server ended the subscription for good (a room closed).
    pub const SERVER: u32 = 2000;
    /// The subscription must be set up again (resubscribe).
    pub const INSUFFICIENT: u32 = 2500;
}

/// The numeric error of a Herald error code, and whether retrying helps.
pub const fn error_of(code: ErrorCode) -> (u32, bool) {
    use error_code as e;
    match code {
        ErrorCode::BadRequest
        | ErrorCode::BadJson
        | ErrorCode::BadChannel
        | ErrorCode::BadData
        | ErrorCode::IdempotencyKeyInvalid
        | ErrorCode::IdempotencyKeyReused
        | ErrorCode::IdempotencyKeyRequired
        | ErrorCode::PayloadTooLarge
        | ErrorCode::HeadersTooLarge
        | ErrorCode::MethodNotAllowed
        | ErrorCode::Conflict
        | ErrorCode::PreconditionFailed
        | ErrorCode::NotSubscribed => (e::BAD_REQUEST, false),
        ErrorCode::UnknownNamespace | ErrorCode::NotFound => (e::UNKNOWN_CHANNEL, false),
        ErrorCode::Unauthorized | ErrorCode::OriginNotAllowed => (e::UNAUTHORIZED, false),
        ErrorCode::TokenExpired => (e::TOKEN_EXPIRED, false),
        ErrorCode::Forbidden | ErrorCode::Banned => (e::PERMISSION_DENIED, false),
        ErrorCode::AlreadySubscribed => (e::ALREADY_SUBSCRIBED, false),
        ErrorCode::TooManySubscriptions | ErrorCode::TooManyConnections => (e::LIMIT_EXCEEDED, false),
        ErrorCode::NotSupported | ErrorCode::ChannelClosed => (e::NOT_AVAILABLE, false),
        ErrorCode::RateLimited => (e::TOO_MANY_REQUESTS, true),
        ErrorCode::IdempotencyKeyInFlight
        | ErrorCode::RequestTimeout
        | ErrorCode::Unavailable
        | ErrorCode::ShuttingDown
        | ErrorCode::Internal => (e::INTERNAL, true),
    }
}

/// One client command. Exactly one method field is expected; unknown
/// fields are ignored. No method at all is a pong (`{}`).
#[derive(Debug, Default, Deserialize)]
pub struct Command {
    #[serde(default)]
    pub id: u32,
    pub connect: Option<ConnectRequest>,
    pub subscribe: Option<SubscribeRequest>,
    pub unsubscribe: Option<ChannelRequest>,
    pub publish: Option<PublishRequest>,
    pub presence: Option<ChannelRequest>,
    pub presence_stats: Option<ChannelRequest>,
    pub history: Option<HistoryRequest>,
    pub ping: Option<serde::de::IgnoredAny>,
    pub send: Option<serde::de::IgnoredAny>,
    pub rpc: Option<serde::de::IgnoredAny>,
    pub refresh: Option<RefreshRequest>,
    pub sub_refresh: Option<serde::de::IgnoredAny>,
}

/// What a command asks for.
#[derive(Debug)]
pub enum Method {
    Pong,
    Connect(ConnectRequest),
    Subscribe(SubscribeRequest),
    Unsubscribe(ChannelRequest),
    Publish(PublishRequest),
    Presence(ChannelRequest),
    PresenceStats(ChannelRequest),
    History(HistoryRequest),
    Ping,
    Refresh(RefreshRequest),
    /// `send`, `rpc`, `sub_refresh`: answered "not available".
    NotAvailable,
}

impl Command {
    /// Parse one line of a frame.
    pub fn parse(line: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(line)
    }

    /// The method, the first one present in protocol order.
    pub fn method(self) -> Method {
        let Command {
            connect,
            subscribe,
            unsubscribe,
            publish,
            presence,
            presence_stats,
            history,
            ping,
            refresh,
            ..
        } = self;
        if let Some(c) = connect {
            Method::Connect(c)
        } else if let Some(s) = subscribe {
            Method::Subscribe(s)
        } else if let Some(u) = unsubscribe {
            Method::Unsubscribe(u)
        } else if let Some(p) = publish {
            Method::Publish(p)
        } else if let Some(p) = presence {
            Method::Presence(p)
        } else if let Some(p) = presence_stats {
            Method::PresenceStats(p)
        } else if let Some(h) = history {
            Method::History(h)
        } else if ping.is_some() {
            Method::Ping
        } else if let Some(r) = refresh {
            Method::Refresh(r)
        } else if self.send.is_some() || self.rpc.is_some() || self.sub_refresh.is_some() {
            Method::NotAvailable
        } else {
            Method::Pong
        }
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct ConnectRequest {
    #[serde(default)]
    pub token: String,
    /// Name and version of the SDK (logged at debug only).
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub version: String,
    /// The positions of the connection's server-side subscriptions, by
    /// channel, for their recovery (`channel` unused).
    #[serde(default)]
    pub subs: BTreeMap<String, SubscribeRequest>,
}

#[derive(Debug, Default, Deserialize)]
pub struct SubscribeRequest {
    /// Empty in `connect`'s `subs` (the map's key names the channel).
    #[serde(default)]
    pub channel: String,
    #[serde(default)]
    pub recover: bool,
    #[serde(default)]
    pub offset: u64,
    #[serde(default)]
    pub epoch: String,
}

#[derive(Debug, Default, Deserialize)]
pub struct ChannelRequest {
    pub channel: String,
}

#[derive(Debug, Deserialize)]
pub struct PublishRequest {
    pub channel: String,
    pub data: Box<RawValue>,
}

#[derive(Debug, Default, Deserialize)]
pub struct HistoryRequest {
    pub channel: String,
    /// 0: no publications (position only); negative: as many as allowed.
    #[serde(default)]
    pub limit: i32,
    #[serde(default)]
    pub since: Option<StreamPosition>,
    #[serde(default)]
    pub reverse: bool,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct StreamPosition {
    #[serde(default)]
    pub offset: u64,
    #[serde(default)]
    pub epoch: String,
}

#[derive(Debug, Default, Deserialize)]
pub struct RefreshRequest {
    #[serde(default)]
    pub token: String,
}

fn is_zero32(n: &u32) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// An empty result object (`{}`).
#[derive(Debug, Default, Serialize)]
pub struct Empty {}

#[derive(Debug, Serialize)]
pub struct Error {
    pub code: u32,
    pub message: String,
    #[serde(skip_serializing_if = "is_false")]
    pub temporary: bool,
}

/// A reply: `id` and one result, or an error.
#[derive(Debug, Serialize)]
pub struct Reply<'a> {
    #[serde(skip_serializing_if = "is_zero32")]
    pub id: u32,
    #[serde(flatten)]
    pub result: Answer<'a>,
}

/// What a reply carries, under its method's name (`{"publish":{}}`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer<'a> {
    Error(Error),
    Connect(ConnectResult<'a>),
    Subscribe(SubscribeResult<'a>),
    Unsubscribe(Empty),
    Publish(Empty),
    Presence(PresenceResult),
    PresenceStats(PresenceStatsResult),
    History(HistoryResult<'a>),
    Ping(Empty),
    Refresh(RefreshResult),
}

impl<'a> Reply<'a> {
    pub fn new(id: u32, result: Answer<'a>) -> Self {
        Reply { id, result }
    }

    /// An error reply to command `id`.
    pub fn error(id: u32, code: ErrorCode, message: impl Into<String>) -> Self {
        let (code, temporary) = error_of(code);
        Self::new(id, Answer::Error(Error { code, message: message.into(), temporary }))
    }

    /// An error reply with one of the protocol's own codes.
    pub fn error_code(id: u32, code: u32, message: impl Into<String>) -> Self {
        Self::new(id, Answer::Error(Error { code, message: message.into(), temporary: false }))
    }

    /// The error reply to a command this server does not offer.
    pub fn not_available(id: u32) -> Self {
        Self::error_code(id, error_code::NOT_AVAILABLE, "not available")
    }

    pub fn encode(&self) -> Vec<u8> {
        frame_safe(serde_json::to_vec(self).expect("replies always serialise"))
    }
}

#[derive(Debug, Default, Serialize)]
pub struct ConnectResult<'a> {
    /// `client`, `version`, `expires`, `ttl`: as a refresh answers them.
    #[serde(flatten)]
    pub session: RefreshResult,
    /// Seconds between the server's pings (`{}`).
    pub ping: u32,
    /// The server expects `{}` back for each ping.
    pub pong: bool,
    /// The server-side subscriptions made on connect, by channel, each as
    /// a subscribe answers it (with its recovery).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub subs: BTreeMap<String, SubscribeResult<'a>>,
}

#[derive(Debug, Default, Serialize)]
pub struct RefreshResult {
    pub client: String,
    pub version: String,
    #[serde(skip_serializing_if = "is_false")]
    pub expires: bool,
    #[serde(skip_serializing_if = "is_zero32")]
    pub ttl: u32,
}

#[derive(Debug, Default, Serialize)]
pub struct SubscribeResult<'a> {
    #[serde(skip_serializing_if = "is_false")]
    pub recoverable: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub positioned: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub epoch: String,
    #[serde(skip_serializing_if = "is_zero")]
    pub offset: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub publications: Vec<Publication<'a>>,
    #[serde(skip_serializing_if = "is_false")]
    pub recovered: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub was_recovering: bool,
}

/// Who published or joined.
#[derive(Debug, Default, Clone, Serialize)]
pub struct ClientInfo {
    pub user: String,
    pub client: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conn_info: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chan_info: Option<serde_json::Value>,
}

impl From<crate::Member> for ClientInfo {
    fn from(m: crate::Member) -> Self {
        ClientInfo { user: m.user, client: m.client_id, conn_info: m.info, chan_info: None }
    }
}

/// One message of a channel.
#[derive(Debug, Serialize)]
pub struct Publication<'a> {
    /// The published `data`, byte for byte.
    pub data: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub info: Option<ClientInfo>,
    /// Herald's seq (durable channels).
    #[serde(skip_serializing_if = "is_zero")]
    pub offset: u64,
    /// Herald's `meta`, plus `herald_id` (the message id) and, for other
    /// kinds than `message`, `herald_type`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// Milliseconds since the Unix epoch.
    #[serde(skip_serializing_if = "is_zero")]
    pub time: u64,
}

/// The tag holding Herald's message id.
pub const TAG_ID: &str = "herald_id";
/// The tag holding the frame kind when it is not `message` (`room`).
pub const TAG_TYPE: &str = "herald_type";

impl<'a> Publication<'a> {
    /// A publication from a stored or broadcast Herald frame.
    pub fn from_stored(f: &'a crate::StoredFrame<'a>, null: &'a RawValue) -> Self {
        let mut tags = f.meta.clone().unwrap_or_default();
        tags.insert(TAG_ID.to_owned(), f.id.clone());
        if f.kind != crate::FrameKind::Message.as_str() {
            tags.insert(TAG_TYPE.to_owned(), f.kind.clone());
        }
        Publication { data: f.data.unwrap_or(null), info: None, offset: f.seq.unwrap_or(0), tags, time: f.ts }
    }
}

#[derive(Debug, Default, Serialize)]
pub struct PresenceResult {
    /// By client id.
    pub presence: BTreeMap<String, ClientInfo>,
}

#[derive(Debug, Default, Serialize)]
pub struct PresenceStatsResult {
    pub num_clients: u64,
    pub num_users: u64,
}

#[derive(Debug, Default, Serialize)]
pub struct HistoryResult<'a> {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub publications: Vec<Publication<'a>>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub epoch: String,
    #[serde(skip_serializing_if = "is_zero")]
    pub offset: u64,
}

/// A push: `{"push":{"channel":..,"pub"|"join"|"leave"|"unsubscribe":..}}`.
#[derive(Debug, Serialize)]
pub struct Push<'a> {
    pub channel: &'a str,
    #[serde(rename = "pub", skip_serializing_if = "Option::is_none")]
    pub publication: Option<Publication<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub join: Option<JoinLeave>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leave: Option<JoinLeave>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unsubscribe: Option<Unsubscribe>,
    /// The server subscribed the connection (a server-side subscription
    /// made after connect).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subscribe: Option<SubscribePush>,
}

/// A `subscribe` push: the stream position the subscription starts at.
#[derive(Debug, Serialize)]
pub struct SubscribePush {
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub recoverable: bool,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub epoch: String,
    #[serde(skip_serializing_if = "is_zero")]
    pub offset: u64,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub positioned: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Serialize)]
pub struct JoinLeave {
    pub info: ClientInfo,
}

#[derive(Debug, Serialize)]
pub struct Unsubscribe {
    pub code: u32,
    pub reason: String,
}

impl<'a> Push<'a> {
    pub fn new(channel: &'a str) -> Self {
        Push { channel, publication: None, join: None, leave: None, unsubscribe: None, subscribe: None }
    }

    pub fn encode(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct Wrapped<'b, 'a> {
            push: &'b Push<'a>,
        }
        frame_safe(serde_json::to_vec(&Wrapped { push: self }).expect("pushes always serialise"))
    }
}

/// The server's ping, and the client's pong.
pub const PING: &[u8] = b"{}";

/// Make an encoded object safe for newline framing: a `\n` in encoded JSON
/// can only be whitespace (inside `data` written raw), so it becomes a
/// space; the value is unchanged.
pub fn frame_safe(mut json: Vec<u8>) -> Vec<u8> {
    for b in json.iter_mut().filter(|b| **b == b'\n') {
        *b = b' ';
    }
    json
}

/// A Herald frame (stored or broadcast) as a Centrifugo push: `message`
/// and `room` frames become `pub`, presence frames `join`/`leave`. `None`
/// for a frame that does not read (corruption; skipped and logged by the
/// caller).
pub fn push_of_frame(channel: &str, frame: &[u8]) -> Option<Vec<u8>> {
    let stored = crate::StoredFrame::parse(frame).ok();
    let null = null_value();
    let mut push = Push::new(channel);
    match stored.as_ref().map(|s| s.kind.as_str()) {
        Some("join" | "leave") | None => {
            let view = crate::MessageView::parse(frame).ok()?;
            let info = JoinLeave { info: ClientInfo::from(view.member?) };
            if view.kind == "join" {
                push.join = Some(info);
            } else {
                push.leave = Some(info);
            }
            Some(push.encode())
        }
        Some(_) => {
            let stored = stored.as_ref()?;
            push.publication = Some(Publication::from_stored(stored, null));
            Some(push.encode())
        }
    }
}

/// JSON `null`, for a frame without `data`.
pub fn null_value() -> &'static RawValue {
    static NULL: std::sync::OnceLock<Box<RawValue>> = std::sync::OnceLock::new();
    NULL.get_or_init(|| RawValue::from_string("null".into()).expect("null is JSON"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{encode_frame, ChannelName, FrameKind};

    #[test]
    fn commands_parse_with_unknown_fields_and_pong() {
        let c = Command::parse(
            r#"{"id":3,"subscribe":{"channel":"a","recover":true,"offset":5,"epoch":"e","flag":1},"x":1}"#,
        )
        .unwrap();
        assert_eq!(c.id, 3);
        match c.method() {
            Method::Subscribe(s) => assert!(s.recover && s.offset == 5 && s.epoch == "e"),
            m => panic!("{m:?}"),
        }
        assert!(matches!(Command::parse("{}").unwrap().method(), Method::Pong));
        assert!(matches!(
            Command::parse(r#"{"id":1,"rpc":{"method":"m"}}"#).unwrap().method(),
            Method::NotAvailable
        ));
        assert_eq!(Reply::new(2, Answer::Publish(Empty {})).encode(), br#"{"id":2,"publish":{}}"#);
        assert_eq!(
            Reply::error(3, ErrorCode::RateLimited, "slow").encode(),
            br#"{"id":3,"error":{"code":111,"message":"slow","temporary":true}}"#
        );
    }

    #[test]
    fn a_message_frame_becomes_a_pub_push_with_data_byte_for_byte_and_no_raw_newline() {
        let ch = ChannelName::new("chat:1").unwrap();
        let data = RawValue::from_string("{\"a\" :\n [1, \"x\\ny\"]}".into()).unwrap();
        let meta = crate::Meta::from([("trace".to_owned(), "t1".to_owned())]);
        let frame = encode_frame(FrameKind::Message, &ch, Some(7), "id-1", 1000, &data, Some(&meta));
        let push = push_of_frame("chat:1", &frame).unwrap();
        assert!(!push.contains(&b'\n'));
        let text = String::from_utf8(push).unwrap();
        assert!(text.contains("{\"a\" :  [1, \"x\\ny\"]}"), "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["push"]["pub"]["offset"], 7);
        assert_eq!(v["push"]["pub"]["tags"]["herald_id"], "id-1");
        assert_eq!(v["push"]["pub"]["tags"]["trace"], "t1");
        assert_eq!(v["push"]["pub"]["data"]["a"][1], "x\ny");
    }

    #[test]
    fn presence_frames_become_join_and_leave() {
        let ch = ChannelName::new("room:1").unwrap();
        let member = RawValue::from_string(r#"{"client_id":"c1","user":"u1"}"#.into()).unwrap();
        let frame = encode_frame(FrameKind::Leave, &ch, None, "id", 1, &member, None);
        let v: serde_json::Value = serde_json::from_slice(&push_of_frame("room:1", &frame).unwrap()).unwrap();
        assert_eq!(v["push"]["leave"]["info"]["user"], "u1");
        assert_eq!(v["push"]["leave"]["info"]["client"], "c1");
    }

    #[test]
    fn stop_codes_are_in_the_sdk_stop_ranges_and_others_are_not() {
        for c in [disconnect::INVALID_TOKEN, disconnect::BAD_REQUEST] {
            assert!((3500..4000).contains(&c));
        }
        for c in [
            disconnect::SHUTDOWN,
            disconnect::SERVER_ERROR,
            disconnect::EXPIRED,
            disconnect::SLOW,
            disconnect::INSUFFICIENT_STATE,
            disconnect::NO_PONG,
            disconnect::TOO_MANY_REQUESTS,
        ] {
            assert!((3000..3500).contains(&c));
        }
    }
}
