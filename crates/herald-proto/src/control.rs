//! The bodies and replies of the backend's actions on users:
//! `/api/v1/users/{user}/…`, `GET /api/v1/channels` and
//! `GET /api/v1/nodes` (docs/protocol.md, "Users, channels and nodes").
//! Parsed here once, for the server; clients encode and decode the same
//! types.

use serde::{Deserialize, Serialize};

use crate::body::{parse_json, BodyError, RequestBody};
use crate::Since;

/// `POST /api/v1/users/{user}/disconnect`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DisconnectBody {
    /// Only this device's connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Only this connection (an `id` of the connection listing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<String>,
    /// Whether the clients may reconnect: close code 4011 (Centrifugo
    /// 3011) if so, 4012 (Centrifugo 3503) if not.
    pub reconnect: bool,
    /// Sent to the client in the close (at most 120 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Refuse the user's (or the device's) connections for this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ban_seconds: Option<u64>,
}

/// `POST /api/v1/users/{user}/revoke`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RevokeBody {
    /// Tokens whose `iat` is earlier than this (ms since the Unix epoch)
    /// are refused, and their connections closed as expired.
    pub issued_before_ms: u64,
}

/// `POST /api/v1/users/{user}/subscriptions`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UserSubscribeBody {
    pub channel: String,
    /// Only this device's connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Deliver from after this position (as a subscribe's `since`); live
    /// when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Since>,
}

impl RequestBody for DisconnectBody {
    fn parse(body: &[u8]) -> Result<Self, BodyError> {
        parse_json(body)
    }
}

impl RequestBody for RevokeBody {
    fn parse(body: &[u8]) -> Result<Self, BodyError> {
        parse_json(body)
    }
}

impl RequestBody for UserSubscribeBody {
    fn parse(body: &[u8]) -> Result<Self, BodyError> {
        parse_json(body)
    }
}

/// One open connection of a user.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct ConnectionInfo {
    /// `{node}/{n}`: unique in the deployment.
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    pub node: String,
    /// `herald`, `centrifugo`, `centrifugo_protobuf` or `sse`.
    pub protocol: String,
    pub connected_at_ms: u64,
    /// The client's address as the proxy in front reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
    pub subscriptions: Vec<String>,
}

/// `GET /api/v1/users/{user}/connections`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct ConnectionsReply {
    pub connections: Vec<ConnectionInfo>,
    /// Nodes of the registry that did not answer in time (their
    /// connections are missing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes_missing: Vec<String>,
}

/// `GET /api/v1/channels?pattern=&limit=&after=`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelsQuery {
    /// `*` matches any run of characters; absent: every channel.
    #[serde(default)]
    pub pattern: Option<String>,
    #[serde(default)]
    pub limit: Option<usize>,
    /// The `next` of the previous page.
    #[serde(default)]
    pub after: Option<String>,
}

/// One active channel.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct ChannelInfo {
    pub channel: String,
    /// Subscriptions over every node.
    pub subscribers: u64,
}

/// A page of active channels.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct ChannelsReply {
    pub channels: Vec<ChannelInfo>,
    /// Where the next page starts (`after`); absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes_missing: Vec<String>,
}

/// One node of the deployment, as it last reported itself.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct NodeView {
    /// Unique per process run.
    pub id: String,
    /// The Herald version the node runs.
    pub version: String,
    pub started_at_ms: u64,
    /// Open client connections.
    pub connections: u64,
    /// Subscriptions of those connections.
    pub subscriptions: u64,
    /// `ok`, or why the node's engine refuses work (`degraded: ...`,
    /// `failed: ...`).
    pub engine: String,
    /// When it reported this (ms since the Unix epoch).
    pub reported_at_ms: u64,
}

/// `GET /api/v1/nodes`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct NodesReply {
    pub nodes: Vec<NodeView>,
}

/// The answer to an action: what it did on the API's side (the
/// connections are told on every node right after).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct ActionReply {
    pub user: String,
    /// `disconnect`, `revoke`, `subscribe`, `unsubscribe`.
    pub action: String,
    /// A ban stored with a disconnect: until then (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub banned_until_ms: Option<u64>,
    /// A revoke: the time in force (the later of this one and any before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued_before_ms: Option<u64>,
}
