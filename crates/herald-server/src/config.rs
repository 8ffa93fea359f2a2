//! Server configuration, with every default in one place.
//!
//! Loaded by the binary from `herald.toml` ([`Config::from_toml`]) plus
//! `HERALD_*` overrides, then checked with [`Config::validate`] before
//! anything starts. Each section holds one concern and each key name has
//! one meaning; the keys of earlier layouts are still read, moved to their
//! new home with a [`Deprecation`] each (`config/deprecated.rs`), and a file
//! naming one setting both ways is refused.

mod deprecated;
#[cfg(test)]
mod tests;
mod validate;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use herald_core::Namespaces;
use serde::{Deserialize, Serialize};

pub use deprecated::{Deprecation, RENAMED};
/// The engines' own settings, embedded as `[redis]` and `[storage]`.
pub use herald_redis::RedisSettings;
pub use herald_store::StoreSettings;

/// Default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8700";
/// Default data directory of the embedded engine.
pub const DEFAULT_DATA_DIR: &str = "./herald-data";
/// Default Redis of the Redis engine.
pub const DEFAULT_REDIS_URL: &str = herald_redis::DEFAULT_URL;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address of the HTTP API and the WebSocket endpoint.
    pub listen: SocketAddr,
    /// Data directory of the embedded engine.
    pub data_dir: PathBuf,
    /// Where messages live: `embedded` (in `data_dir`, one node) or `redis`
    /// (in Redis at `redis.url`, shared by every node).
    pub engine: EngineKind,
    /// Allow token-less WebSocket connections with `?user=NAME`. Insecure.
    pub dev: bool,
    /// API keys for `/api/v1` (`Authorization: Bearer <key>`). Each key is its
    /// own idempotency scope.
    pub api_keys: Vec<String>,
    /// The log filter (`info`, `warn,herald_server=debug`, ...); `HERALD_LOG`
    /// wins over it. Unset: `info` (the storage library's own lines at
    /// `warn`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
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
    pub jwt: JwtConfig,
    pub http: HttpConfig,
    pub websocket: WebSocketConfig,
    pub rate_limits: RateLimitConfig,
    pub heartbeat: HeartbeatConfig,
    pub publish: PublishConfig,
    pub history: HistoryConfig,
    pub shutdown: ShutdownConfig,
    pub presence: PresenceConfig,
    pub personal: PersonalConfig,
    pub sse: SseConfig,
    pub storage: StoreSettings,
    pub redis: RedisSettings,
    pub namespaces: Namespaces,
    /// `[[webhooks]]`: ordered deliveries to the backend (docs/webhooks.md).
    pub webhooks: Vec<crate::webhooks::WebhookConfig>,
    /// `[[consumers]]`: outbox tables and streams published from
    /// (docs/consumers.md).
    pub consumers: Vec<crate::consumers::ConsumerConfig>,
    /// `[proxies]`: backend endpoints asked before acting (docs/proxies.md).
    pub proxies: crate::proxies::ProxiesConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN.parse().expect("valid default address"),
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            engine: EngineKind::Embedded,
            dev: false,
            api_keys: Vec::new(),
            log: None,
            idempotency_ttl: Duration::from_secs(24 * 3600),
            console: ConsoleSetting::Auto,
            allowed_origins: Vec::new(),
            cors_origins: Vec::new(),
            jwt: JwtConfig::default(),
            http: HttpConfig::default(),
            websocket: WebSocketConfig::default(),
            rate_limits: RateLimitConfig::default(),
            heartbeat: HeartbeatConfig::default(),
            publish: PublishConfig::default(),
            history: HistoryConfig::default(),
            shutdown: ShutdownConfig::default(),
            presence: PresenceConfig::default(),
            personal: PersonalConfig::default(),
            sse: SseConfig::default(),
            storage: StoreSettings::default(),
            redis: RedisSettings::default(),
            namespaces: Namespaces::default(),
            webhooks: Vec::new(),
            consumers: Vec::new(),
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

/// Token verification for WebSocket clients: the keys a token may be
/// signed with (several at once, chosen by the token's `kid`), an identity
/// provider's JWKS endpoint, and the claims every token must carry.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwtConfig {
    /// HS256 shared secret (a key without a `kid`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hs256_secret: Option<String>,
    /// RS256 public key, PEM text (a key without a `kid`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rs256_public_key_pem: Option<String>,
    /// ES256 (P-256) public key, PEM text (a key without a `kid`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub es256_public_key_pem: Option<String>,
    /// `[[jwt.keys]]`: more keys, each with its algorithm and usually a
    /// `kid`, all valid at once (rotation: add the new key, move the
    /// token issuer to it, remove the old one once its tokens expired).
    pub keys: Vec<JwtKey>,
    /// An identity provider's JWKS endpoint (`https://`; `http://` only to
    /// a loopback address). Its keys are valid beside the static ones.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jwks_url: Option<String>,
    /// Shortest time between two fetches of the JWKS, whatever asks for
    /// it (its cache headers, a token with an unknown `kid`, a failure).
    #[serde(with = "humantime_serde")]
    pub jwks_refresh_min: Duration,
    /// Longest time the JWKS is used without a fetch (its `Cache-Control:
    /// max-age` is held between the two bounds; without one, this).
    #[serde(with = "humantime_serde")]
    pub jwks_refresh_max: Duration,
    /// Accepted `iss` values; when set, a token must carry one of them.
    pub issuers: Vec<String>,
    /// Accepted `aud` values; when set, a token's `aud` must name one.
    pub audiences: Vec<String>,
    /// Clock skew allowed on `exp` and `nbf`, in seconds.
    pub leeway_secs: u64,
    /// How long a connection that can refresh its token on the socket (the
    /// Centrifugo protocol's `refresh`) stays open past `exp` (plus
    /// `leeway_secs`) while its refresh is on the way. Connections that
    /// cannot refresh close at `exp` (plus `leeway_secs`).
    #[serde(with = "humantime_serde")]
    pub refresh_grace: Duration,
}

impl Default for JwtConfig {
    fn default() -> Self {
        Self {
            hs256_secret: None,
            rs256_public_key_pem: None,
            es256_public_key_pem: None,
            keys: Vec::new(),
            jwks_url: None,
            jwks_refresh_min: Duration::from_secs(30),
            jwks_refresh_max: Duration::from_secs(3600),
            issuers: Vec::new(),
            audiences: Vec::new(),
            leeway_secs: 0,
            refresh_grace: Duration::from_secs(5),
        }
    }
}

/// One `[[jwt.keys]]` entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtKey {
    /// The `kid` of the tokens it signs. Without one, the key is tried for
    /// every token of its algorithm that no other key's `kid` names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kid: Option<String>,
    /// `HS256`, `RS256`, `ES256` or `EdDSA` (Ed25519).
    pub alg: JwtAlg,
    /// HS256: the shared secret (at least 32 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// RS256, ES256, EdDSA: the public key, PEM text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key_pem: Option<String>,
}

/// The token algorithms Herald accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JwtAlg {
    HS256,
    RS256,
    ES256,
    EdDSA,
}

/// `[http]`: connections that are not WebSocket sessions (API requests,
/// keep-alive, handshakes not yet upgraded) and what one request may send.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Most such connections open at once. At the cap a new connection
    /// closes the oldest one that is not in the middle of a request.
    pub max_connections: usize,
    /// From accept (or the first byte after a keep-alive pause) until a
    /// request's headers are complete; past it the connection is closed.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// From the end of a request's headers until its whole body has arrived;
    /// past it the request gets 408.
    #[serde(with = "humantime_serde")]
    pub body_read_timeout: Duration,
    /// A keep-alive connection waiting this long for its next request is
    /// closed.
    #[serde(with = "humantime_serde")]
    pub keep_alive_timeout: Duration,
    /// Largest request head (request line and headers), in bytes (431 above).
    pub max_header_bytes: usize,
    /// Largest request body, in bytes (413 above).
    pub max_body_bytes: usize,
    /// Serve HTTP/2 over cleartext to clients that open with its preface
    /// (prior knowledge) beside HTTP/1.1 on the same port.
    pub http2: bool,
    /// Most requests in flight at once on one HTTP/2 connection.
    pub http2_max_concurrent_streams: u32,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            keep_alive_timeout: Duration::from_secs(120),
            max_header_bytes: 16 * 1024,
            max_body_bytes: 256 * 1024,
            http2: true,
            http2_max_concurrent_streams: 256,
        }
    }
}

/// `[websocket]`: WebSocket sessions (`/ws` and the Centrifugo endpoint),
/// what a client may send on one, and what may wait to be written to it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebSocketConfig {
    /// Most concurrent sessions. Capped at start to stay below the
    /// open-files limit; upgrades above it get 503.
    pub max_connections: usize,
    /// Largest WebSocket frame a client may send, in bytes (close 1009
    /// above); also the largest `data` a publish may carry (413 above).
    pub max_message_bytes: usize,
    /// Subscriptions one connection may hold.
    pub max_subscriptions: usize,
    /// Publishes one connection may have read and not yet answered
    /// (pipelined: queued or with the engine). At the bound the
    /// connection's socket is not read until a batch is answered.
    pub max_publishes_in_flight: usize,
    /// Bytes of `data` of the publishes one connection has read and not yet
    /// answered. Reading stops once they reach it, so it is exceeded by at
    /// most one publish.
    pub max_publish_bytes_in_flight: usize,
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
}

impl Default for WebSocketConfig {
    fn default() -> Self {
        Self {
            max_connections: 100_000,
            max_message_bytes: 64 * 1024,
            max_subscriptions: 256,
            max_publishes_in_flight: 256,
            max_publish_bytes_in_flight: 4 * 1024 * 1024,
            outbox_capacity: 1024,
            outbox_bytes: 4 * 1024 * 1024,
            total_outbox_bytes: 256 * 1024 * 1024,
        }
    }
}

/// `[rate_limits]`: the frame budget of one WebSocket connection.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Client frames per second per connection (burst of the same size).
    pub client_frames_per_sec: u32,
    /// A connection is closed with 4009 when more than this percentage of
    /// its frame budget over the last `close_window` was refused.
    pub close_percent: u32,
    /// The sliding window over which refused frames are counted.
    #[serde(with = "humantime_serde")]
    pub close_window: Duration,
    /// `error` frames sent per second per connection (burst of the same
    /// size); errors beyond it are dropped without a reply, and counted.
    pub error_replies_per_sec: u32,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            client_frames_per_sec: 100,
            close_percent: 50,
            close_window: Duration::from_secs(10),
            error_replies_per_sec: 50,
        }
    }
}

/// `[heartbeat]`: how a WebSocket connection is kept alive and found dead.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HeartbeatConfig {
    /// Interval of server WebSocket pings.
    #[serde(with = "humantime_serde")]
    pub ping_interval: Duration,
    /// A connection that sends nothing (not even a pong) for this long is closed.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        Self { ping_interval: Duration::from_secs(25), idle_timeout: Duration::from_secs(60) }
    }
}

/// `[publish]`: what one publish (HTTP, batch or socket) may ask for.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PublishConfig {
    /// Deepest nesting of arrays/objects a published `data` may have
    /// (400 `bad_data` above); at most `herald_proto::MAX_DATA_DEPTH_LIMIT`.
    pub max_data_depth: usize,
    /// Channels one batch publish may name.
    pub max_batch_channels: usize,
    /// Messages one `POST /api/v1/messages` may carry (413 above).
    pub max_batch_messages: usize,
    /// Furthest ahead a publish may be scheduled (`deliver_at`/`delay_ms`).
    #[serde(with = "humantime_serde")]
    pub max_schedule_ahead: Duration,
}

impl Default for PublishConfig {
    fn default() -> Self {
        Self {
            max_data_depth: 64,
            max_batch_channels: 100,
            max_batch_messages: 1000,
            max_schedule_ahead: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

/// `[history]`: history reads (HTTP and the Centrifugo protocol).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HistoryConfig {
    /// Largest `limit` of one history request: the most messages it returns.
    pub max_limit: usize,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        Self { max_limit: 1000 }
    }
}

/// `[personal]`: each user's own channel, `{namespace}:{user}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PersonalConfig {
    /// Subscribe every connection to its user's channel on connect (`/ws`:
    /// a subscription the client is told about; the Centrifugo endpoint: a
    /// server-side subscription).
    pub subscribe: bool,
    /// The namespace of the personal channels; its delivery mode applies.
    pub namespace: String,
}

impl Default for PersonalConfig {
    fn default() -> Self {
        Self { subscribe: false, namespace: "user".into() }
    }
}

/// `[sse]`: Server-Sent Events streams (`GET /sse`, docs/sse.md). They
/// count under `websocket.max_connections` and its other per-connection
/// limits, as a WebSocket subscriber does.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SseConfig {
    /// Serve `GET /sse` (off: 404).
    pub enabled: bool,
    /// Most channels one stream may name; it bounds the `Last-Event-ID`
    /// the stream's events carry (one position per channel).
    pub max_channels: usize,
    /// The stream's `retry:`: how long a browser waits before it
    /// reconnects a stream that ended.
    #[serde(with = "humantime_serde")]
    pub retry: Duration,
}

impl Default for SseConfig {
    fn default() -> Self {
        Self { enabled: true, max_channels: 16, retry: Duration::from_secs(2) }
    }
}

/// `[shutdown]`: what happens on SIGTERM.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShutdownConfig {
    /// Time given to connections to close before the engine is closed;
    /// also the longest a drain runs (the rest then close at once).
    #[serde(with = "humantime_serde")]
    pub grace: Duration,
    /// On SIGTERM (or `POST /api/v1/admin/drain`), the WebSocket sessions
    /// are closed one by one over this period (`0s`: all at once), so their
    /// reconnects reach the other nodes spread out.
    #[serde(with = "humantime_serde")]
    pub drain_period: Duration,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self { grace: Duration::from_secs(30), drain_period: Duration::from_secs(15) }
    }
}

/// `[presence]`: presence leases and the room keeper.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PresenceConfig {
    /// A member whose connection stops renewing (dropped without a close)
    /// leaves this long after its last renewal. Connections renew every
    /// third of it.
    #[serde(with = "humantime_serde")]
    pub member_lease_ttl: Duration,
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
            member_lease_ttl: Duration::from_secs(30),
            sweep_interval: Duration::from_secs(1),
            max_members_listed: 1000,
        }
    }
}

impl PresenceConfig {
    /// How often a connection renews its leases.
    pub fn renew_interval(&self) -> Duration {
        self.member_lease_ttl / 3
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    Embedded,
    Redis,
}

/// A configuration file that could not be read as a [`Config`]: one line
/// for the operator, with the line of the file it is about when known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}{}", line.map(|l| format!(" (line {l})")).unwrap_or_default())]
pub struct ParseError {
    pub message: String,
    /// 1-based line in the file.
    pub line: Option<usize>,
}

impl ParseError {
    fn at(text: &str, message: impl Into<String>, span: Option<std::ops::Range<usize>>) -> Self {
        let line = span
            .map(|s| text.as_bytes()[..s.start.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1);
        Self { message: message.into(), line }
    }
}

/// What [`Config::from_toml`] read: the configuration and one
/// [`Deprecation`] per key of an earlier layout it moved.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    pub deprecations: Vec<Deprecation>,
}

impl Config {
    /// Read a configuration file's text. Keys of earlier layouts are moved
    /// to their new home and reported; an unknown key, a wrong type, or a
    /// setting given under both its old and its new key is an error.
    /// Values are not checked here: that is [`Config::validate`].
    pub fn from_toml(text: &str) -> Result<Loaded, ParseError> {
        let mut doc =
            toml::de::DeTable::parse(text).map_err(|e| ParseError::at(text, e.message(), e.span()))?;
        let deprecations =
            deprecated::migrate(doc.get_mut()).map_err(|(m, span)| ParseError::at(text, m, span))?;
        let config = Config::deserialize(toml::de::Deserializer::from(doc))
            .map_err(|e| ParseError::at(text, e.message(), e.span()))?;
        Ok(Loaded { config, deprecations })
    }

    /// Whether `/console/` is served.
    pub fn console_enabled(&self) -> bool {
        match self.console {
            ConsoleSetting::Auto => self.dev,
            ConsoleSetting::On => true,
            ConsoleSetting::Off => false,
        }
    }
}
