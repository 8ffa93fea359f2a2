//! The backend's hold on users, on every node: the orders the API sends
//! (disconnect, revoke, subscribe, unsubscribe) and the list queries
//! (connections of a user, active channels), carried between nodes by the
//! engine's control channel ([`herald_core::Control`]), and this node's
//! report in the engine's node registry.
//!
//! Every order goes to every node, this one included, through the engine,
//! and each node applies it to its own sessions ([`Orders::order`]). A
//! list query is answered by every node on the same channel; the asker
//! waits for an answer from each node of the registry, at most
//! [`LIST_WAIT`], and names the nodes that did not answer. Orders are
//! idempotent where a session applies them: a second disconnect finds no
//! session, a second subscribe finds the channel subscribed, a second
//! unsubscribe finds it not.
//!
//! Delivery is bounded by the control channel: an order reaches the
//! sessions of every node connected to the engine within its pub/sub
//! latency plus one turn of each session's loop. A node cut off from the
//! engine misses orders sent meanwhile; bans and revocations are stored,
//! so they still refuse the next connection on every node.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use herald_core::{ControlSink, Health, NodeView};
use herald_proto::{close, ChannelName, ConnectionInfo, ErrorCode, Since};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::hub::{Closing, Order};
use crate::state::AppState;

/// How often a node reports itself to the registry.
pub const NODE_REPORT: Duration = Duration::from_secs(1);
/// How long a report holds: a node that stops reporting leaves
/// `GET /api/v1/nodes` within this.
pub const NODE_LEASE: Duration = Duration::from_secs(5);
/// How long a list waits for the other nodes' answers.
pub const LIST_WAIT: Duration = Duration::from_secs(2);
/// Most channels one `GET /api/v1/channels` page lists (and its default).
pub const CHANNELS_MAX: usize = 1000;
pub const CHANNELS_DEFAULT: usize = 100;
/// Longest `reason` of a disconnect, in bytes (a close frame's reason
/// holds 123).
pub const MAX_REASON_LEN: usize = 120;

/// What travels on the control channel, as JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Message {
    /// Close the user's connections (all, one device's, or one).
    Disconnect {
        user: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        device: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        connection: Option<String>,
        code: u16,
        reason: String,
        reconnect: bool,
    },
    /// Close the user's connections whose token was issued before
    /// `before_ms` (token expired).
    Revoke { user: String, before_ms: u64 },
    Subscribe {
        user: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        device: Option<String>,
        channel: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        since: Option<Since>,
    },
    Unsubscribe {
        user: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        device: Option<String>,
        channel: String,
    },
    /// A list query from node `from`.
    Ask { id: u64, from: String, query: Query },
    /// Node `node`'s answer to query `id` of node `to`.
    Answer { id: u64, to: String, node: String, body: serde_json::Value },
}

/// What a list asks each node.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Query {
    Connections { user: String },
    Channels { pattern: Option<String>, after: Option<String>, limit: usize },
}

/// The answers a list gathered, and the nodes that gave none in time.
pub struct Gathered {
    pub answers: Vec<(String, serde_json::Value)>,
    pub missing: Vec<String>,
}

/// This node's side of the control channel (the engine's sink for it).
pub struct Orders {
    node_id: Arc<str>,
    started_at_ms: u64,
    state: OnceLock<Weak<AppState>>,
    /// List queries of this node waiting for answers, by id.
    waiting: Mutex<HashMap<u64, mpsc::UnboundedSender<(String, serde_json::Value)>>>,
    next_query: AtomicU64,
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Orders {
    pub fn new(node_id: String) -> Self {
        Self {
            node_id: Arc::from(node_id),
            started_at_ms: now_ms(),
            state: OnceLock::new(),
            waiting: Mutex::default(),
            next_query: AtomicU64::new(1),
        }
    }

    /// Bind to the server's state (once, when it is built).
    pub fn attach(&self, state: &Arc<AppState>) {
        let _ = self.state.set(Arc::downgrade(state));
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// A connection's id in the deployment.
    pub fn connection_id(&self, conn: u64) -> String {
        format!("{}/{conn}", self.node_id)
    }

    /// Send `msg` to every node, this one included.
    pub async fn send(&self, state: &AppState, msg: &Message) -> Result<(), ApiError> {
        let bytes = serde_json::to_vec(msg).expect("control messages serialise");
        state.engine.broadcast(Bytes::from(bytes)).await?;
        Ok(())
    }

    /// Ask every node of the registry (and this one) and gather the
    /// answers, waiting at most [`LIST_WAIT`].
    pub async fn ask(&self, state: &AppState, query: Query) -> Result<Gathered, ApiError> {
        let mut expected: Vec<String> = state.engine.nodes().await?.into_iter().map(|n| n.id).collect();
        if !expected.iter().any(|n| **n == *self.node_id) {
            expected.push(self.node_id.to_string());
        }
        let id = self.next_query.fetch_add(1, Ordering::Relaxed);
        let (tx, mut rx) = mpsc::unbounded_channel();
        self.waiting.lock().expect("control lock poisoned").insert(id, tx);
        let _forget = Forget(self, id);
        self.send(state, &Message::Ask { id, from: self.node_id.to_string(), query }).await?;
        let mut answers: BTreeMap<String, serde_json::Value> = BTreeMap::new();
        let deadline = tokio::time::Instant::now() + LIST_WAIT;
        while !expected.iter().all(|n| answers.contains_key(n)) {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some((node, body))) => {
                    answers.insert(node, body);
                }
                Ok(None) | Err(_) => break,
            }
        }
        let missing = expected.into_iter().filter(|n| !answers.contains_key(n)).collect();
        Ok(Gathered { answers: answers.into_iter().collect(), missing })
    }

    fn state(&self) -> Option<Arc<AppState>> {
        self.state.get()?.upgrade()
    }

    /// Apply an order to this node's sessions.
    fn apply(&self, state: &Arc<AppState>, msg: Message) {
        match msg {
            Message::Disconnect { user, device, connection, code, reason, reconnect } => {
                let reason: Arc<str> = Arc::from(reason);
                let mut n = 0;
                for (id, info, mailbox) in state.sessions.of_user(&user) {
                    let fits = device.as_deref().is_none_or(|d| info.device.as_deref() == Some(d))
                        && connection.as_deref().is_none_or(|c| c == self.connection_id(id));
                    if fits {
                        mailbox.disconnect(Closing { code, reason: reason.clone(), reconnect });
                        n += 1;
                    }
                }
                state.metrics.control_applied("disconnect", n);
                if n > 0 {
                    tracing::info!(user = %user, connections = n, code, "connections disconnected for the backend");
                }
            }
            Message::Revoke { user, before_ms } => {
                let mut n = 0;
                for (_, info, mailbox) in state.sessions.of_user(&user) {
                    if info.iat.is_some_and(|iat| iat.saturating_mul(1000) < before_ms) {
                        mailbox.disconnect(Closing {
                            code: close::TOKEN_EXPIRED,
                            reason: Arc::from("token revoked"),
                            reconnect: true,
                        });
                        n += 1;
                    }
                }
                state.metrics.control_applied("revoke", n);
                if n > 0 {
                    tracing::info!(user = %user, connections = n, "connections with revoked tokens closed");
                }
            }
            Message::Subscribe { user, device, channel, since } => {
                let Ok(channel) = ChannelName::new(&channel) else { return };
                let n = self.order(state, &user, device.as_deref(), || Order::Subscribe {
                    channel: channel.clone(),
                    since: since.clone(),
                });
                state.metrics.control_applied("subscribe", n);
            }
            Message::Unsubscribe { user, device, channel } => {
                let Ok(channel) = ChannelName::new(&channel) else { return };
                let n = self.order(state, &user, device.as_deref(), || Order::Unsubscribe {
                    channel: channel.clone(),
                });
                state.metrics.control_applied("unsubscribe", n);
            }
            Message::Ask { id, from, query } => {
                let body = self.answer(state, query);
                let answer = Message::Answer { id, to: from, node: self.node_id.to_string(), body };
                let state = state.clone();
                tokio::spawn(async move {
                    if let Err(e) = state.control.send(&state, &answer).await {
                        tracing::debug!(error = %e.detail, "list answer not sent");
                    }
                });
            }
            Message::Answer { id, to, node, body } => {
                if *to == *self.node_id {
                    if let Some(tx) = self.waiting.lock().expect("control lock poisoned").get(&id) {
                        let _ = tx.send((node, body));
                    }
                }
            }
        }
    }

    /// Queue an order for the user's sessions (of one device); how many
    /// took it.
    fn order(&self, state: &AppState, user: &str, device: Option<&str>, make: impl Fn() -> Order) -> u64 {
        let mut n = 0;
        for (id, info, mailbox) in state.sessions.of_user(user) {
            if device.is_some_and(|d| info.device.as_deref() != Some(d)) {
                continue;
            }
            if mailbox.order(make()) {
                n += 1;
            } else {
                tracing::warn!(conn = id, "order refused: the session has too many waiting");
            }
        }
        n
    }

    /// This node's answer to a list query.
    fn answer(&self, state: &AppState, query: Query) -> serde_json::Value {
        match query {
            Query::Connections { user } => {
                let sessions = state.sessions.of_user(&user);
                let ids: Vec<u64> = sessions.iter().map(|s| s.0).collect();
                let mut channels = state.hub.channels_of(&ids);
                let list: Vec<ConnectionInfo> = sessions
                    .into_iter()
                    .map(|(id, info, _)| ConnectionInfo {
                        id: self.connection_id(id),
                        device: info.device.as_deref().map(str::to_owned),
                        node: self.node_id.to_string(),
                        protocol: info.protocol.to_owned(),
                        connected_at_ms: info.connected_at_ms,
                        remote: info.remote.as_deref().map(str::to_owned),
                        subscriptions: channels
                            .remove(&id)
                            .unwrap_or_default()
                            .into_iter()
                            .map(|c| c.to_string())
                            .collect(),
                    })
                    .collect();
                serde_json::to_value(list).expect("connections serialise")
            }
            Query::Channels { pattern, after, limit } => {
                let list = state.hub.channels(
                    |c| pattern.as_deref().is_none_or(|p| glob(p, c)),
                    after.as_deref(),
                    limit.min(CHANNELS_MAX),
                );
                let list: Vec<(String, usize)> = list.into_iter().map(|(c, n)| (c.to_string(), n)).collect();
                serde_json::to_value(list).expect("channels serialise")
            }
        }
    }

    /// This node's registry entry now.
    pub fn report(&self, state: &AppState) -> NodeView {
        NodeView {
            id: self.node_id.to_string(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            started_at_ms: self.started_at_ms,
            connections: state.sessions.count() as u64,
            subscriptions: state.hub.subscriptions() as u64,
            engine: match state.engine.health() {
                Health::Ready => "ok".to_owned(),
                Health::Unavailable(reason) => format!("unavailable: {reason}"),
                Health::Failed(reason) => format!("failed: {reason}"),
            },
            reported_at_ms: now_ms(),
        }
    }
}

/// Forgets a list query when its asker is done (or dropped).
struct Forget<'a>(&'a Orders, u64);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.waiting.lock().expect("control lock poisoned").remove(&self.1);
    }
}

impl ControlSink for Orders {
    fn order(&self, order: Bytes) {
        let Some(state) = self.state() else { return };
        match serde_json::from_slice::<Message>(&order) {
            Ok(msg) => self.apply(&state, msg),
            Err(e) => tracing::warn!(error = %e, "malformed control message ignored"),
        }
    }
}

/// Whether `name` matches `pattern`, where `*` stands for any run of
/// characters (none included) and every other character for itself.
pub fn glob(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ni));
            pi += 1;
        } else if pi < p.len() && p[pi] == n[ni] {
            pi += 1;
            ni += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&b| b == b'*')
}

/// Report this node to the registry every [`NODE_REPORT`] until shutdown,
/// then take it out.
pub async fn report_node(state: Arc<AppState>) {
    let control = state.control.clone();
    loop {
        let report = control.report(&state);
        if let Err(e) = state.engine.node_report(&report, NODE_LEASE).await {
            tracing::debug!(error = %e, "node report failed; retrying");
        }
        tokio::select! {
            () = state.shutdown.cancelled() => break,
            () = tokio::time::sleep(NODE_REPORT) => {}
        }
    }
    if let Err(e) = state.engine.node_leave(control.node_id()).await {
        tracing::debug!(error = %e, "node entry not removed (its lease ends by itself)");
    }
}

/// A user or device id from the API, by the id rule.
pub fn check_user(what: &str, id: &str) -> Result<(), ApiError> {
    herald_proto::check_id(id).map_err(|e| ApiError::new(ErrorCode::BadRequest, format!("`{what}` {e}")))
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn glob_matches_stars_anywhere_and_the_rest_literally() {
        assert!(glob("*", "chat:1"));
        assert!(glob("chat:*", "chat:1"));
        assert!(!glob("chat:*", "news:1"));
        assert!(glob("*:1", "chat:1"));
        assert!(glob("c*t:*1", "chat:room1"));
        assert!(glob("chat:1", "chat:1"));
        assert!(!glob("chat:1", "chat:10"));
        assert!(glob("a**b", "ab"));
        assert!(!glob("", "a"));
    }
}
