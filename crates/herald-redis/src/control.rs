//! `herald_core::Control` on Redis: bans and revocations as keys, the
//! control channel as a pub/sub channel on a connection of its own, and the
//! node registry as a hash of reports with a sorted set of lease ends.
//!
//! | key | type | contents |
//! |---|---|---|
//! | `p:ctl:{<user key>}:ban` | string, TTL | the user's ban: until (ms); expires with it |
//! | `p:ctl:{<user key>}:ban:<device>` | string, TTL | one device's ban |
//! | `p:ctl:{<user key>}:revoke` | string | tokens issued before this (ms) are refused |
//! | `p:{nodes}:info` | hash | node id → its last report (JSON `NodeView`) |
//! | `p:{nodes}:exp` | sorted set | node id, scored by when its lease ends (ms) |
//!
//! and the pub/sub channel `p:control`. The user key is
//! `SubscriberId::user_prefix` (`{len}:{user}`), so a user's keys share a
//! slot and are read in one `MGET`. Lease ends use each node's clock: a
//! node whose clock runs ahead stays listed that much longer.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use herald_core::{Admission, Ban, ControlSink, EngineError, NodeView};
use redis::{ProtocolVersion, PushKind, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::conn::Conn;
use crate::dial::open_conn;
use crate::state::EngineState;
use crate::{RedisConfig, RedisError};

/// Orders received and not yet handed to the sink; beyond it they are
/// dropped (the channel is at most once anyway) and logged.
const ORDER_QUEUE: usize = 4096;

/// Raise the value of KEYS[1] to ARGV[1]; with ARGV[2] = 1, expire the key
/// at that time (ms). Returns the value in force.
const RAISE: &str = r"
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local new = tonumber(ARGV[1])
if cur >= new then return cur end
if ARGV[2] == '1' then
  redis.call('SET', KEYS[1], ARGV[1], 'PXAT', ARGV[1])
else
  redis.call('SET', KEYS[1], ARGV[1])
end
return new
";

/// The control channel's own pub/sub connection and where its orders go.
pub(crate) struct Bus {
    /// Kept for its subscription; the client library resubscribes after a
    /// reconnect (orders published meanwhile are missed).
    _conn: Conn,
    pub sink: Arc<OnceLock<Arc<dyn ControlSink>>>,
    pub channel: String,
}

fn user_key(user: &str) -> String {
    format!("{}:{user}", user.len())
}

fn ban_key(prefix: &str, user: &str, device: Option<&str>) -> String {
    match device {
        Some(d) => format!("{prefix}:ctl:{{{}}}:ban:{d}", user_key(user)),
        None => format!("{prefix}:ctl:{{{}}}:ban", user_key(user)),
    }
}

fn revoke_key(prefix: &str, user: &str) -> String {
    format!("{prefix}:ctl:{{{}}}:revoke", user_key(user))
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Bus {
    /// Open the connection, subscribe `p:control` and hand every order to
    /// the sink (once set) until `cancel`.
    pub async fn open(
        config: &RedisConfig,
        tasks: &tokio_util::task::TaskTracker,
        cancel: CancellationToken,
    ) -> Result<Self, RedisError> {
        let (tx, mut rx) = mpsc::channel::<redis::PushInfo>(ORDER_QUEUE);
        let push = move |info| {
            if tx.try_send(info).is_err() {
                tracing::warn!("control queue full: an order was dropped");
            }
            Ok::<(), ()>(())
        };
        let push: Arc<dyn redis::aio::AsyncPushSender> = Arc::new(push);
        let conn = open_conn(config, ProtocolVersion::RESP3, Some(push)).await?;
        let channel = format!("{}:control", config.key_prefix);
        let subscribed = match conn.clone() {
            Conn::Single(mut c) => c.subscribe(&channel).await,
            Conn::Cluster(mut c) => c.subscribe(&channel).await,
        };
        subscribed.map_err(|e| RedisError::Connect(format!("control channel: {e}")))?;
        let sink: Arc<OnceLock<Arc<dyn ControlSink>>> = Arc::default();
        let to = sink.clone();
        tasks.spawn(async move {
            loop {
                let push = tokio::select! {
                    biased;
                    () = cancel.cancelled() => return,
                    p = rx.recv() => match p { Some(p) => p, None => return },
                };
                if !matches!(push.kind, PushKind::Message) {
                    continue;
                }
                let mut data = push.data.into_iter();
                if let (Some(_), Some(Value::BulkString(order))) = (data.next(), data.next()) {
                    if let Some(sink) = to.get() {
                        sink.order(Bytes::from(order));
                    }
                }
            }
        });
        Ok(Self { _conn: conn, sink, channel })
    }
}

impl EngineState {
    pub(crate) async fn ban(&self, ban: &Ban) -> Result<(), EngineError> {
        let key = ban_key(self.keys.prefix(), &ban.user, ban.device.as_deref());
        let until = ban.until_ms;
        self.redis
            .call("ban", |mut c| async move {
                redis::Script::new(RAISE).key(key).arg(until).arg(1).invoke_async::<i64>(&mut c).await
            })
            .await?;
        Ok(())
    }

    pub(crate) async fn revoke(&self, user: &str, before_ms: u64) -> Result<u64, EngineError> {
        let key = revoke_key(self.keys.prefix(), user);
        let v = self
            .redis
            .call("revoke", |mut c| async move {
                redis::Script::new(RAISE).key(key).arg(before_ms).arg(0).invoke_async::<i64>(&mut c).await
            })
            .await?;
        Ok(u64::try_from(v).unwrap_or(0))
    }

    pub(crate) async fn admission(
        &self,
        user: &str,
        device: Option<&str>,
        now: u64,
    ) -> Result<Admission, EngineError> {
        let p = self.keys.prefix();
        let mut keys = vec![revoke_key(p, user), ban_key(p, user, None)];
        if let Some(d) = device.filter(|d| !d.is_empty()) {
            keys.push(ban_key(p, user, Some(d)));
        }
        let vals: Vec<Option<u64>> = self
            .redis
            .call("admission", |mut c| async move { redis::cmd("MGET").arg(keys).query_async(&mut c).await })
            .await?;
        let revoked_before_ms = vals.first().copied().flatten();
        let banned_until_ms = vals.iter().skip(1).copied().flatten().filter(|&u| u > now).max();
        Ok(Admission { banned_until_ms, revoked_before_ms })
    }

    pub(crate) async fn publish_order(&self, channel: &str, order: Bytes) -> Result<(), EngineError> {
        let channel = channel.to_owned();
        self.redis
            .call("control publish", |mut c| async move {
                redis::cmd("PUBLISH").arg(channel).arg(order.as_ref()).query_async::<i64>(&mut c).await
            })
            .await?;
        Ok(())
    }

    fn node_keys(&self) -> (String, String) {
        let p = self.keys.prefix();
        (format!("{p}:{{nodes}}:info"), format!("{p}:{{nodes}}:exp"))
    }

    pub(crate) async fn node_report(&self, node: &NodeView, lease: Duration) -> Result<(), EngineError> {
        let (info, exp) = self.node_keys();
        let until = now_ms().saturating_add(lease.as_millis() as u64);
        let json = serde_json::to_string(node).expect("a node report serialises");
        let id = node.id.clone();
        self.redis
            .call("node report", |mut c| async move {
                redis::pipe()
                    .atomic()
                    .hset(&info, &id, json)
                    .ignore()
                    .zadd(&exp, &id, until)
                    .ignore()
                    .query_async::<()>(&mut c)
                    .await
            })
            .await
    }

    pub(crate) async fn node_leave(&self, id: &str) -> Result<(), EngineError> {
        let (info, exp) = self.node_keys();
        let id = id.to_owned();
        self.redis
            .call("node leave", |mut c| async move {
                redis::pipe()
                    .atomic()
                    .hdel(&info, &id)
                    .ignore()
                    .zrem(&exp, &id)
                    .ignore()
                    .query_async::<()>(&mut c)
                    .await
            })
            .await
    }

    /// The live entries; ended ones are removed on the way (any reader may).
    pub(crate) async fn nodes(&self) -> Result<Vec<NodeView>, EngineError> {
        let (info, exp) = self.node_keys();
        let now = now_ms();
        let (ended, live): (Vec<String>, Vec<String>) = {
            let exp = exp.clone();
            self.redis
                .call("nodes", |mut c| async move {
                    redis::pipe()
                        .zrangebyscore(&exp, "-inf", now)
                        .zrangebyscore(&exp, format!("({now}"), "+inf")
                        .query_async(&mut c)
                        .await
                })
                .await?
        };
        if !ended.is_empty() {
            let (info, exp, ended) = (info.clone(), exp.clone(), ended.clone());
            self.redis
                .call("nodes sweep", |mut c| async move {
                    redis::pipe()
                        .atomic()
                        .hdel(&info, &ended)
                        .ignore()
                        .zrem(&exp, &ended)
                        .ignore()
                        .query_async::<()>(&mut c)
                        .await
                })
                .await?;
        }
        if live.is_empty() {
            return Ok(Vec::new());
        }
        let reports: Vec<Option<String>> = self
            .redis
            .call("nodes", |mut c| async move {
                redis::cmd("HMGET").arg(&info).arg(&live).query_async(&mut c).await
            })
            .await?;
        let mut nodes: Vec<NodeView> =
            reports.into_iter().flatten().filter_map(|r| serde_json::from_str(&r).ok()).collect();
        nodes.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(nodes)
    }
}
