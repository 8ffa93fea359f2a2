//! Server configuration, with every default in one place.
//!
//! Loaded by the binary from `herald.toml` plus `HERALD_*` overrides, then
//! checked with [`Config::validate`] before anything starts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use herald_core::Namespaces;
use serde::{Deserialize, Serialize};

/// The engines' own settings, embedded as `[redis]` and `[storage]`.
pub use herald_redis::RedisSettings;
pub use herald_store::StoreSettings;

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
    pub storage: StoreSettings,
    pub presence: PresenceConfig,
    /// How long idempotency receipts are kept.
    #[serde(with = "humantime_serde")]
    pub idempotency_ttl: Duration,
    /// The web console at `/console/`: `auto` (served with `dev = true`
    /// only), `on` or `off`. Outside dev mode its page asks for the API key.
    pub console: ConsoleSetting,
    /// Origins a browser page may open `/ws` from, besides the server's own
    /// (an `Origin` whose host:port is the request's `Host`): exact origins
    /// (`https://app.example.com`) or `*` for any. Requests without an
    /// `Origin` (non-browser clients) are not checked; dev mode allows every
    /// origin.
    pub allowed_origins: Vec<String>,
    /// Origins allowed to call `/api/v1` from a browser (CORS): exact
    /// origins or `*`. Empty: no CORS headers, so browsers allow only the
    /// server's own pages.
    pub cors_origins: Vec<String>,
    pub namespaces: Namespaces,
    /// `[[webhooks]]`: ordered deliveries to the backend (docs/webhooks.md).
    pub webhooks: Vec<crate::webhooks::WebhookConfig>,
    /// `[proxies]`: backend endpoints asked before acting (docs/proxies.md).
    pub proxies: crate::proxies::ProxiesConfig,
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
            storage: StoreSettings::default(),
            presence: PresenceConfig::default(),
            idempotency_ttl: Duration::from_secs(24 * 3600),
            console: ConsoleSetting::Auto,
            allowed_origins: Vec::new(),
            cors_origins: Vec::new(),
            namespaces: Namespaces::default(),
            webhooks: Vec::new(),
            proxies: Default::default(),
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
    /// Most open connections that are not WebSocket sessions (HTTP requests,
    /// keep-alive, handshakes not yet upgraded). At the cap a new connection
    /// closes the oldest one that is not in the middle of a request.
    pub max_http_connections: usize,
    /// From accept (or the first byte after a keep-alive pause) until a
    /// request's headers are complete; past it the connection is closed.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// From the end of a request's headers until its whole body has arrived;
    /// past it the request gets 408.
    #[serde(with = "humantime_serde")]
    pub body_read_timeout: Duration,
    /// A keep-alive HTTP connection waiting this long for its next request
    /// is closed.
    #[serde(with = "humantime_serde")]
    pub http_idle_timeout: Duration,
    /// Largest request head (request line and headers), in bytes (431 above).
    pub max_header_bytes: usize,
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
    /// Publishes one WebSocket connection may have read and not yet
    /// answered (pipelined: queued or with the engine). At the bound the
    /// connection's socket is not read until a batch is answered.
    pub max_publishes_in_flight: usize,
    /// Channels one batch publish may name.
    pub max_batch_channels: usize,
    /// Messages one history request may return.
    pub max_history_limit: usize,
    /// Deepest nesting of arrays/objects a published `data` may have
    /// (400 `bad_data` above); at most `herald_proto::MAX_DATA_DEPTH_LIMIT`.
    pub max_data_depth: usize,
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
    /// Furthest ahead a publish may be scheduled (`deliver_at`/`delay_ms`).
    #[serde(with = "humantime_serde")]
    pub max_schedule_ahead: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 100_000,
            max_http_connections: 4096,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            http_idle_timeout: Duration::from_secs(120),
            max_header_bytes: 16 * 1024,
            max_message_bytes: 64 * 1024,
            max_body_bytes: 256 * 1024,
            outbox_capacity: 1024,
            outbox_bytes: 4 * 1024 * 1024,
            total_outbox_bytes: 256 * 1024 * 1024,
            max_subscriptions: 256,
            max_publishes_in_flight: 256,
            max_batch_channels: 100,
            max_history_limit: 1000,
            max_data_depth: 64,
            client_frames_per_sec: 100,
            rate_limit_close_percent: 50,
            rate_limit_window: Duration::from_secs(10),
            error_replies_per_sec: 50,
            ping_interval: Duration::from_secs(25),
            idle_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(10),
            max_schedule_ahead: Duration::from_secs(30 * 24 * 3600),
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    Embedded,
    Redis,
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
        crate::webhooks::config::validate_all(&self.webhooks)?;
        self.proxies.validate()?;
        let l = &self.limits;
        if l.max_connections == 0 {
            return Err("limits.max_connections must be at least 1".into());
        }
        if l.max_http_connections < 16 {
            return Err("limits.max_http_connections must be at least 16".into());
        }
        if l.header_read_timeout.is_zero() || l.body_read_timeout.is_zero() || l.http_idle_timeout.is_zero() {
            return Err(
                "limits.header_read_timeout, body_read_timeout and http_idle_timeout must be positive".into(),
            );
        }
        // Above 64 KiB hyper answers a long URI with a bare 414; below, every
        // oversized head is a 431 problem document.
        if !(1024..=65_535).contains(&l.max_header_bytes) {
            return Err("limits.max_header_bytes must be 1024..=65535".into());
        }
        if l.max_message_bytes < 256 {
            return Err("limits.max_message_bytes must be at least 256".into());
        }
        if l.max_body_bytes < 256 {
            return Err("limits.max_body_bytes must be at least 256".into());
        }
        if l.max_publishes_in_flight == 0 {
            return Err("limits.max_publishes_in_flight must be at least 1".into());
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
        if l.max_data_depth == 0 || l.max_data_depth > herald_proto::MAX_DATA_DEPTH_LIMIT {
            return Err(format!(
                "limits.max_data_depth must be 1..={} (deeper data would not parse in common clients)",
                herald_proto::MAX_DATA_DEPTH_LIMIT
            ));
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
            if self.redis_url.split(',').all(|u| u.trim().is_empty()) {
                return Err("redis_url must name at least one Redis".into());
            }
            self.redis.validate()?;
        }
        let p = &self.presence;
        if p.lease_ttl < Duration::from_millis(300) || p.sweep_interval.is_zero() || p.max_members_listed == 0
        {
            return Err(
                "presence.lease_ttl must be at least 300ms, sweep_interval positive and max_members_listed at least 1"
                    .into(),
            );
        }
        self.storage.validate()?;
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
        crate::browser::Origins::parse(&self.allowed_origins).map_err(|e| format!("allowed_origins: {e}"))?;
        crate::browser::Origins::parse(&self.cors_origins).map_err(|e| format!("cors_origins: {e}"))?;
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
        for depth in [0, herald_proto::MAX_DATA_DEPTH_LIMIT + 1] {
            let mut c = Config::default();
            c.limits.max_data_depth = depth;
            assert!(c.validate().unwrap_err().contains("max_data_depth"), "{depth}");
        }
        let mut c = Config::default();
        c.limits.max_data_depth = herald_proto::MAX_DATA_DEPTH_LIMIT;
        c.validate().unwrap();
    }

    #[test]
    fn connection_bounds_and_origins_are_validated() {
        let mut c = Config::default();
        c.limits.header_read_timeout = Duration::ZERO;
        assert!(c.validate().unwrap_err().contains("header_read_timeout"));
        let mut c = Config::default();
        c.limits.max_header_bytes = 100_000;
        assert!(c.validate().unwrap_err().contains("max_header_bytes"));
        let mut c = Config::default();
        c.limits.max_http_connections = 1;
        assert!(c.validate().unwrap_err().contains("max_http_connections"));
        let c = Config { cors_origins: vec!["app.example.com".into()], ..Default::default() };
        assert!(c.validate().unwrap_err().contains("cors_origins"));
        let c: Config =
            toml::from_str("allowed_origins = [\"*\"]\n[limits]\nhttp_idle_timeout = \"90s\"\n").unwrap();
        assert_eq!(c.limits.http_idle_timeout, Duration::from_secs(90));
        c.validate().unwrap();
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
