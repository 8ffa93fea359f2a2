//! Server configuration, with every default in one place.
//!
//! Loaded by the binary from `herald.toml` plus `HERALD_*` overrides, then
//! checked with [`Config::validate`] before anything starts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use herald_core::Namespaces;
use serde::{Deserialize, Serialize};

/// Default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8700";
/// Default data directory of the embedded engine.
pub const DEFAULT_DATA_DIR: &str = "./herald-data";
/// Default Redis of the Redis engine.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address of the HTTP API and the WebSocket endpoint.
    pub listen: SocketAddr,
    /// Data directory of the embedded engine.
    pub data_dir: PathBuf,
    /// Where messages live: `embedded` (in `data_dir`, one node) or `redis`
    /// (in Redis at `redis_url`, shared by every node).
    pub engine: EngineKind,
    /// The Redis engine's Redis: one URL, or a comma-separated list of
    /// Redis Cluster seed nodes.
    pub redis_url: String,
    pub redis: RedisSettings,
    /// Allow token-less WebSocket connections with `?user=NAME`. Insecure.
    pub dev: bool,
    /// API keys for `/api/v1` (`Authorization: Bearer <key>`). Each key is its
    /// own idempotency scope.
    pub api_keys: Vec<String>,
    pub jwt: JwtConfig,
    pub limits: Limits,
    pub storage: StorageConfig,
    pub presence: PresenceConfig,
    /// How long idempotency receipts are kept.
    #[serde(with = "humantime_serde")]
    pub idempotency_ttl: Duration,
    /// The web console at `/console/`: `auto` (served with `dev = true`
    /// only), `on` or `off`. Outside dev mode its page asks for the API key.
    pub console: ConsoleSetting,
    pub namespaces: Namespaces,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN.parse().expect("valid default address"),
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            engine: EngineKind::Embedded,
            redis_url: DEFAULT_REDIS_URL.to_owned(),
            redis: RedisSettings::default(),
            dev: false,
            api_keys: Vec::new(),
            jwt: JwtConfig::default(),
            limits: Limits::default(),
            storage: StorageConfig::default(),
            presence: PresenceConfig::default(),
            idempotency_ttl: Duration::from_secs(24 * 3600),
            console: ConsoleSetting::Auto,
            namespaces: Namespaces::default(),
        }
    }
}

/// Whether the web console is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConsoleSetting {
    /// Served in dev mode only.
    Auto,
    On,
    Off,
}

/// Token verification for WebSocket clients.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwtConfig {
    /// HS256 shared secret. Enables HS256 when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hs256_secret: Option<String>,
    /// RS256 public key, PEM text. Enables RS256 when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rs256_public_key_pem: Option<String>,
    /// ES256 (P-256) public key, PEM text. Enables ES256 when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub es256_public_key_pem: Option<String>,
    /// Clock skew allowed on `exp` and `nbf`, in seconds.
    pub leeway_secs: u64,
}

/// Explicit limits. Every queue and size in the server is bounded by one of
/// these.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Most concurrent WebSocket connections. Capped at start to stay below
    /// the open-files limit; upgrades above it get 503.
    pub max_connections: usize,
    /// Largest WebSocket frame a client may send, in bytes (close 1009 above).
    pub max_message_bytes: usize,
    /// Largest HTTP request body, in bytes (413 above).
    pub max_body_bytes: usize,
    /// Frames queued for one connection before it is a slow consumer.
    pub outbox_capacity: usize,
    /// Bytes of frames queued for one connection (its outbox, the batch it
    /// is writing, the catch-up page it holds) before it is a slow consumer.
    /// A frame is always accepted into an empty outbox, whatever its size.
    pub outbox_bytes: usize,
    /// Bytes of frames queued for all connections together (each frame
    /// counted once however many outboxes share it). At this ceiling a
    /// connection holding more than half its `outbox_bytes` is kicked as a
    /// slow consumer, the others read the message from the log later, and
    /// volatile messages are dropped.
    pub total_outbox_bytes: usize,
    /// Subscriptions one connection may hold.
    pub max_subscriptions: usize,
    /// Channels one batch publish may name.
    pub max_batch_channels: usize,
    /// Messages one history request may return.
    pub max_history_limit: usize,
    /// Client frames per second per connection (burst of the same size).
    pub client_frames_per_sec: u32,
    /// A connection is closed with 4009 when more than this percentage of
    /// its frame budget over the last `rate_limit_window` was refused.
    pub rate_limit_close_percent: u32,
    /// The sliding window over which refused frames are counted.
    #[serde(with = "humantime_serde")]
    pub rate_limit_window: Duration,
    /// `error` frames sent per second per connection (burst of the same
    /// size); errors beyond it are dropped without a reply, and counted.
    pub error_replies_per_sec: u32,
    /// Interval of server WebSocket pings.
    #[serde(with = "humantime_serde")]
    pub ping_interval: Duration,
    /// A connection that sends nothing (not even a pong) for this long is closed.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Time given to connections to close on shutdown.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 100_000,
            max_message_bytes: 64 * 1024,
            max_body_bytes: 256 * 1024,
            outbox_capacity: 1024,
            outbox_bytes: 4 * 1024 * 1024,
            total_outbox_bytes: 256 * 1024 * 1024,
            max_subscriptions: 256,
            max_batch_channels: 100,
            max_history_limit: 1000,
            client_frames_per_sec: 100,
            rate_limit_close_percent: 50,
            rate_limit_window: Duration::from_secs(10),
            error_replies_per_sec: 50,
            ping_interval: Duration::from_secs(25),
            idle_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// Presence leases and the room keeper.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PresenceConfig {
    /// A member whose connection stops renewing (dropped without a close)
    /// leaves this long after its last renewal. Connections renew every
    /// third of it.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// How often expired leases are swept (and their `leave` announced) and
    /// room timers (host lost, grace over) are checked.
    #[serde(with = "humantime_serde")]
    pub sweep_interval: Duration,
    /// Most members one presence listing returns.
    pub max_members_listed: usize,
}

impl Default for PresenceConfig {
    fn default() -> Self {
        Self {
            lease_ttl: Duration::from_secs(30),
            sweep_interval: Duration::from_secs(1),
            max_members_listed: 1000,
        }
    }
}

impl PresenceConfig {
    /// How often a connection renews its leases.
    pub fn renew_interval(&self) -> Duration {
        self.lease_ttl / 3
    }
}

/// Embedded engine settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// `always`: a publish is answered after its batch is fsynced (default).
    /// `never`: answered after the write reaches the OS; a machine crash can
    /// lose the last moments of acknowledged publishes.
    pub fsync: FsyncSetting,
    /// Most appends sharing one fsync.
    pub max_batch: usize,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self { fsync: FsyncSetting::Always, max_batch: 512 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    Embedded,
    Redis,
}

/// Redis engine settings (used with `engine = "redis"`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisSettings {
    /// Longest a Redis command may take; past it the call fails (503).
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
    pub lease_ttl: Duration,
    /// The node's id (its lease is `<key_prefix>:node:{id}`); default: random.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// Every Redis key and pub/sub channel starts with `<key_prefix>:`.
    /// Nodes serving the same channels share it; separate deployments on
    /// one Redis use different ones.
    pub key_prefix: String,
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            command_timeout: Duration::from_secs(2),
            connections: 2,
            head_check_interval: Duration::from_secs(1),
            lease_ttl: Duration::from_secs(10),
            node_id: None,
            key_prefix: "herald".into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsyncSetting {
    Always,
    Never,
}

impl Config {
    /// Whether `/console/` is served.
    pub fn console_enabled(&self) -> bool {
        match self.console {
            ConsoleSetting::Auto => self.dev,
            ConsoleSetting::On => true,
            ConsoleSetting::Off => false,
        }
    }

    /// Check the whole configuration; the error is one line for the operator.
    pub fn validate(&self) -> Result<(), String> {
        self.namespaces.validate()?;
        let l = &self.limits;
        if l.max_connections == 0 {
            return Err("limits.max_connections must be at least 1".into());
        }
        if l.max_message_bytes < 256 {
            return Err("limits.max_message_bytes must be at least 256".into());
        }
        if l.max_body_bytes < 256 {
            return Err("limits.max_body_bytes must be at least 256".into());
        }
        if l.outbox_capacity < 16 {
            return Err("limits.outbox_capacity must be at least 16".into());
        }
        if l.max_subscriptions == 0 || l.max_batch_channels == 0 || l.max_history_limit == 0 {
            return Err(
                "limits.max_subscriptions, max_batch_channels and max_history_limit must be at least 1"
                    .into(),
            );
        }
        if l.client_frames_per_sec == 0 {
            return Err("limits.client_frames_per_sec must be at least 1".into());
        }
        if l.rate_limit_close_percent == 0 || l.rate_limit_window < Duration::from_millis(100) {
            return Err(
                "limits.rate_limit_close_percent must be at least 1 and rate_limit_window at least 100ms"
                    .into(),
            );
        }
        if l.error_replies_per_sec == 0 {
            return Err("limits.error_replies_per_sec must be at least 1".into());
        }
        // A frame may exceed `max_message_bytes` by its envelope (channel,
        // id, meta); twice the largest message leaves room for it and one more.
        if l.outbox_bytes < 2 * l.max_message_bytes {
            return Err("limits.outbox_bytes must be at least twice limits.max_message_bytes".into());
        }
        if l.total_outbox_bytes < 2 * l.outbox_bytes {
            return Err("limits.total_outbox_bytes must be at least twice limits.outbox_bytes".into());
        }
        if l.ping_interval.is_zero() || l.idle_timeout <= l.ping_interval {
            return Err(
                "limits.idle_timeout must be longer than limits.ping_interval (and both non-zero)".into()
            );
        }
        if self.engine == EngineKind::Redis {
            let r = &self.redis;
            if self.redis_url.split(',').all(|u| u.trim().is_empty()) {
                return Err("redis_url must name at least one Redis".into());
            }
            if r.command_timeout.is_zero() || r.head_check_interval.is_zero() {
                return Err("redis.command_timeout and redis.head_check_interval must be positive".into());
            }
            if r.connections == 0 || r.connections > 64 {
                return Err("redis.connections must be 1..=64".into());
            }
            if r.lease_ttl < Duration::from_secs(1) {
                return Err("redis.lease_ttl must be at least 1s".into());
            }
        }
        let p = &self.presence;
        if p.lease_ttl < Duration::from_millis(300) || p.sweep_interval.is_zero() || p.max_members_listed == 0
        {
            return Err(
                "presence.lease_ttl must be at least 300ms, sweep_interval positive and max_members_listed at least 1"
                    .into(),
            );
        }
        if self.storage.max_batch == 0 {
            return Err("storage.max_batch must be at least 1".into());
        }
        if self.idempotency_ttl.is_zero() {
            return Err("idempotency_ttl must be positive".into());
        }
        if self.api_keys.iter().any(|k| k.len() < 16) {
            return Err("api_keys must each be at least 16 characters".into());
        }
        if let Some(s) = &self.jwt.hs256_secret {
            if s.len() < 32 {
                return Err("jwt.hs256_secret must be at least 32 bytes".into());
            }
        }
        crate::auth::JwtVerifier::new(&self.jwt).map_err(|e| format!("jwt: {e}"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_round_trip_through_toml() {
        let c = Config::default();
        c.validate().unwrap();
        let text = toml::to_string(&c).unwrap();
        let back: Config = toml::from_str(&text).unwrap();
        assert_eq!(back.listen, c.listen);
        assert_eq!(back.limits.max_message_bytes, 64 * 1024);
        assert_eq!(back.namespaces, c.namespaces);
    }

    #[test]
    fn rejects_unknown_keys_and_bad_limits() {
        assert!(toml::from_str::<Config>("listen_addr = \"x\"").is_err());
        let mut c = Config::default();
        c.limits.idle_timeout = Duration::from_secs(1);
        assert!(c.validate().unwrap_err().contains("idle_timeout"));
        let mut c = Config::default();
        c.limits.outbox_bytes = c.limits.max_message_bytes;
        assert!(c.validate().unwrap_err().contains("outbox_bytes"));
        let mut c = Config::default();
        c.limits.total_outbox_bytes = c.limits.outbox_bytes;
        assert!(c.validate().unwrap_err().contains("total_outbox_bytes"));
        let mut c = Config::default();
        c.limits.rate_limit_close_percent = 0;
        assert!(c.validate().unwrap_err().contains("rate_limit_close_percent"));
        let c = Config { api_keys: vec!["short".into()], ..Default::default() };
        assert!(c.validate().is_err());
    }

    #[test]
    fn redis_engine_settings_parse_and_validate() {
        let c: Config = toml::from_str(
            "engine = \"redis\"\nredis_url = \"redis://a:1,redis://b:2\"\n[redis]\ncommand_timeout = \"500ms\"\nconnections = 4\n",
        )
        .unwrap();
        assert_eq!(c.engine, EngineKind::Redis);
        assert_eq!(c.redis.command_timeout, Duration::from_millis(500));
        assert_eq!(c.redis.connections, 4);
        c.validate().unwrap();
        assert!(toml::from_str::<Config>("engine = \"memcached\"").is_err());
    }

    #[test]
    fn console_is_served_in_dev_mode_unless_set() {
        let mut c = Config::default();
        assert!(!c.console_enabled(), "auto without dev: off");
        c.dev = true;
        assert!(c.console_enabled(), "auto with dev: on");
        c.console = ConsoleSetting::Off;
        assert!(!c.console_enabled());
        let c: Config = toml::from_str("console = \"on\"").unwrap();
        assert!(c.console_enabled() && !c.dev);
        assert!(toml::from_str::<Config>("console = \"yes\"").is_err());
        let c = Config { engine: EngineKind::Redis, redis_url: " , ".into(), ..Default::default() };
        assert!(c.validate().unwrap_err().contains("redis_url"));
    }
}
