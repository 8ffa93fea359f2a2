//! Settings of the Redis engine, with every default in one place.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::RedisError;

/// Longest a Redis command may take before the engine call fails with
/// `EngineError::Unavailable` (a SIGSTOPped Redis must not hang publishes).
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// Command connections per Redis node (each multiplexed: many requests in
/// flight on one socket). The pub/sub connection comes on top.
pub const DEFAULT_CONNECTIONS: usize = 2;
/// How often the fan-out checks the head of each watched channel that had
/// no message since the last check, to catch a silently lost pub/sub
/// message.
pub const DEFAULT_HEAD_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Life of the node's lease key; it is refreshed every third of it.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
/// Pub/sub messages buffered between the connection and the fan-out task,
/// at most (and at most [`DEFAULT_FANOUT_QUEUE_BYTES`] of them). When one
/// more does not fit it is dropped and every watched channel is checked
/// against its head: a durable message is then read from the log, a
/// volatile one is lost.
pub const DEFAULT_FANOUT_QUEUE: usize = 65_536;
/// Bytes of those messages (their channel names and payloads), at most.
pub const DEFAULT_FANOUT_QUEUE_BYTES: usize = 64 * 1024 * 1024;
/// The least `fanout_queue` and `fanout_queue_bytes` accepted.
const MIN_FANOUT_QUEUE: usize = 16;
const MIN_FANOUT_QUEUE_BYTES: usize = 64 * 1024;
/// Gap fills and head checks running at once.
pub const DEFAULT_FILL_CONCURRENCY: usize = 16;
/// Messages one gap-fill read asks for.
pub const FILL_PAGE: usize = 256;
/// The Redis of a deployment that names none.
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379";
/// The start of every key (and pub/sub channel) name.
pub const DEFAULT_KEY_PREFIX: &str = "herald";
/// Channels one `presence_expire` call takes from the sweep index at most.
pub const SWEEP_CHANNELS: usize = 64;

/// What an operator sets of the Redis engine: the `[redis]` section of
/// `herald.toml`. The rest of [`RedisConfig`] keeps its defaults in a
/// deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisSettings {
    /// One URL, or a comma-separated list of Redis Cluster seed nodes.
    pub url: String,
    /// Longest a Redis command may take; past it the call fails (503).
    /// Also the connect timeout.
    #[serde(with = "humantime_serde")]
    pub command_timeout: Duration,
    /// Command connections per Redis node (multiplexed), plus one for pub/sub.
    pub connections: usize,
    /// How often watched channels that were quiet are checked against
    /// their head (catches a lost pub/sub message).
    #[serde(with = "humantime_serde")]
    pub head_check_interval: Duration,
    /// Life of the node's lease key in Redis.
    #[serde(with = "humantime_serde")]
    pub node_lease_ttl: Duration,
    /// The node's id (its lease is `<key_prefix>:node:{id}`); default: random.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// Every Redis key and pub/sub channel starts with `<key_prefix>:`.
    /// Nodes serving the same channels share it; separate deployments on
    /// one Redis use different ones.
    pub key_prefix: String,
    /// Pub/sub messages queued on this node for its fan-out, at most.
    pub fanout_queue: usize,
    /// Bytes of those messages, at most.
    pub fanout_queue_bytes: usize,
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            url: DEFAULT_URL.to_owned(),
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            connections: DEFAULT_CONNECTIONS,
            head_check_interval: DEFAULT_HEAD_CHECK_INTERVAL,
            node_lease_ttl: DEFAULT_LEASE_TTL,
            node_id: None,
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            fanout_queue: DEFAULT_FANOUT_QUEUE,
            fanout_queue_bytes: DEFAULT_FANOUT_QUEUE_BYTES,
        }
    }
}

impl RedisSettings {
    /// Check the settings an operator may get wrong; the error is one line
    /// naming the key. The rest is checked when the engine opens
    /// ([`RedisConfig::validate`]).
    pub fn validate(&self) -> Result<(), String> {
        if self.command_timeout.is_zero() || self.head_check_interval.is_zero() {
            return Err("redis.command_timeout and redis.head_check_interval must be positive".into());
        }
        if self.connections == 0 || self.connections > 64 {
            return Err("redis.connections must be 1..=64".into());
        }
        if self.node_lease_ttl < Duration::from_secs(1) {
            return Err("redis.node_lease_ttl must be at least 1s".into());
        }
        if self.fanout_queue < MIN_FANOUT_QUEUE {
            return Err(format!("redis.fanout_queue must be at least {MIN_FANOUT_QUEUE}"));
        }
        if self.fanout_queue_bytes < MIN_FANOUT_QUEUE_BYTES {
            return Err(format!("redis.fanout_queue_bytes must be at least {MIN_FANOUT_QUEUE_BYTES}"));
        }
        Ok(())
    }
}

/// How to reach Redis and how patient to be with it.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// One URL: a single instance. Several: seed nodes of a Redis Cluster.
    pub urls: Vec<String>,
    pub command_timeout: Duration,
    /// Also the connect timeout of each attempt.
    pub connect_timeout: Duration,
    pub connections: usize,
    pub head_check_interval: Duration,
    pub lease_ttl: Duration,
    /// Names the node's lease (`<key_prefix>:node:{id}`); default: a random id.
    pub node_id: Option<String>,
    /// Every key and pub/sub channel name starts with `<key_prefix>:`.
    /// Nodes that share channels must share it; deployments (or tests) on
    /// one Redis that must not see each other use different ones.
    pub key_prefix: String,
    /// See [`DEFAULT_FANOUT_QUEUE`].
    pub fanout_queue: usize,
    /// See [`DEFAULT_FANOUT_QUEUE_BYTES`].
    pub fanout_queue_bytes: usize,
    pub fill_concurrency: usize,
}

impl RedisConfig {
    /// `url` may be a comma-separated list (a Redis Cluster).
    pub fn new(url: &str) -> Self {
        Self {
            urls: url.split(',').map(str::trim).filter(|u| !u.is_empty()).map(str::to_owned).collect(),
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            connect_timeout: DEFAULT_COMMAND_TIMEOUT,
            connections: DEFAULT_CONNECTIONS,
            head_check_interval: DEFAULT_HEAD_CHECK_INTERVAL,
            lease_ttl: DEFAULT_LEASE_TTL,
            node_id: None,
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            fanout_queue: DEFAULT_FANOUT_QUEUE,
            fanout_queue_bytes: DEFAULT_FANOUT_QUEUE_BYTES,
            fill_concurrency: DEFAULT_FILL_CONCURRENCY,
        }
    }

    /// The defaults, with an operator's settings (`url` as in
    /// [`new`](RedisConfig::new)).
    pub fn with_settings(settings: &RedisSettings) -> Self {
        Self {
            command_timeout: settings.command_timeout,
            connect_timeout: settings.command_timeout,
            connections: settings.connections,
            head_check_interval: settings.head_check_interval,
            lease_ttl: settings.node_lease_ttl,
            node_id: settings.node_id.clone(),
            key_prefix: settings.key_prefix.clone(),
            fanout_queue: settings.fanout_queue,
            fanout_queue_bytes: settings.fanout_queue_bytes,
            ..Self::new(&settings.url)
        }
    }

    pub fn is_cluster(&self) -> bool {
        self.urls.len() > 1
    }

    pub fn validate(&self) -> Result<(), RedisError> {
        let bad = |m: &str| Err(RedisError::Config(m.to_owned()));
        if self.urls.is_empty() {
            return bad("redis.url is empty");
        }
        if self.command_timeout.is_zero() || self.connect_timeout.is_zero() {
            return bad("redis command and connect timeouts must be positive");
        }
        if self.connections == 0 || self.connections > 64 {
            return bad("redis connections must be 1..=64");
        }
        if self.head_check_interval < Duration::from_millis(10) {
            return bad("redis head_check_interval must be at least 10ms");
        }
        if self.lease_ttl < Duration::from_millis(300) {
            return bad("redis lease_ttl must be at least 300ms");
        }
        if self.fanout_queue < MIN_FANOUT_QUEUE || self.fanout_queue_bytes < MIN_FANOUT_QUEUE_BYTES {
            return bad("redis.fanout_queue must be at least 16 and redis.fanout_queue_bytes at least 65536");
        }
        if self.fill_concurrency == 0 {
            return bad("redis fill_concurrency must be at least 1");
        }
        if let Some(id) = &self.node_id {
            if id.is_empty() || id.len() > 128 || id.chars().any(|c| c.is_control() || c == '{' || c == '}') {
                return bad("redis node_id must be 1..=128 characters without braces or control characters");
            }
        }
        let p = &self.key_prefix;
        if p.is_empty()
            || p.len() > 64
            || p.chars().any(|c| c.is_control() || c.is_whitespace() || c == '{' || c == '}')
        {
            return bad(
                "redis key_prefix must be 1..=64 characters without braces, spaces or control characters",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_fill_the_config_and_bad_ones_name_their_key() {
        let s = RedisSettings {
            command_timeout: Duration::from_millis(500),
            node_id: Some("n1".into()),
            url: "redis://a:1, redis://b:2".into(),
            fanout_queue: 100,
            fanout_queue_bytes: 1 << 20,
            ..RedisSettings::default()
        };
        let c = RedisConfig::with_settings(&s);
        assert!(c.is_cluster());
        assert_eq!((c.command_timeout, c.connect_timeout), (s.command_timeout, s.command_timeout));
        assert_eq!((c.node_id.as_deref(), c.fanout_queue, c.fanout_queue_bytes), (Some("n1"), 100, 1 << 20));
        c.validate().unwrap();
        let d = RedisConfig::with_settings(&RedisSettings::default());
        let n = RedisConfig::new(DEFAULT_URL);
        assert_eq!(
            (d.command_timeout, d.connections, d.key_prefix),
            (n.command_timeout, n.connections, n.key_prefix)
        );
        let bad = RedisSettings { connections: 0, ..RedisSettings::default() };
        assert_eq!(bad.validate(), Err("redis.connections must be 1..=64".to_owned()));
        let bad = RedisSettings { node_lease_ttl: Duration::from_millis(900), ..RedisSettings::default() };
        assert!(bad.validate().unwrap_err().contains("redis.node_lease_ttl"));
        let bad = RedisSettings { fanout_queue: 15, ..RedisSettings::default() };
        assert!(bad.validate().unwrap_err().contains("redis.fanout_queue "));
        let bad = RedisSettings { fanout_queue_bytes: 1000, ..RedisSettings::default() };
        assert!(bad.validate().unwrap_err().contains("redis.fanout_queue_bytes"));
        let d = RedisSettings::default();
        assert_eq!(
            (d.fanout_queue, d.fanout_queue_bytes),
            (DEFAULT_FANOUT_QUEUE, DEFAULT_FANOUT_QUEUE_BYTES)
        );
    }
}
