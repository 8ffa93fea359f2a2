//! Configuration loading: defaults < `herald.toml` < `HERALD_*` environment
//! < command-line flags. An invalid configuration is one line on stderr and
//! exit code 64 (EX_USAGE). Keys of earlier layouts in the file are read
//! and come back as deprecations, logged once the logger is up.

use std::path::{Path, PathBuf};

use herald_server::config::Loaded;
use herald_server::Config;

/// Exit code for an unusable configuration.
pub const EXIT_CONFIG: i32 = 64;

/// Overrides that come from flags (each also readable from `HERALD_*`).
#[derive(Debug, Default, clap::Args)]
pub struct ServeFlags {
    /// Address to listen on [default: 127.0.0.1:8700]
    #[arg(long, env = "HERALD_LISTEN")]
    pub listen: Option<String>,
    /// Data directory of the embedded engine [default: ./herald-data]
    #[arg(long, env = "HERALD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// `embedded` (default: the log in --data-dir, one node) or `redis`
    /// (the log in Redis, shared by several nodes)
    #[arg(long, env = "HERALD_ENGINE")]
    pub engine: Option<String>,
    /// Redis of the Redis engine; a comma-separated list is a Redis Cluster
    /// [default: redis://127.0.0.1:6379]
    #[arg(long, env = "HERALD_REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,
    /// Configuration file (TOML); `herald config` prints every key
    /// [default: ./herald.toml if it exists]
    #[arg(long, env = "HERALD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Accept token-less WebSocket connections (`?user=NAME`) and API calls
    /// without a key. INSECURE: local trial only.
    #[arg(long, env = "HERALD_DEV")]
    pub dev: bool,
    /// API keys, comma-separated (each at least 16 characters)
    #[arg(long, env = "HERALD_API_KEYS", hide_env_values = true)]
    pub api_keys: Option<String>,
    /// HS256 secret for client tokens (at least 32 bytes)
    #[arg(long, env = "HERALD_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,
    /// An identity provider's JWKS endpoint for client tokens
    /// (jwt.jwks_url; https://, or http:// to a loopback address)
    #[arg(long, env = "HERALD_JWKS_URL")]
    pub jwks_url: Option<String>,
    /// Most concurrent WebSocket connections
    #[arg(long, env = "HERALD_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// `always` (default: reply after fsync) or `never` (reply after the OS
    /// has the write)
    #[arg(long, env = "HERALD_FSYNC")]
    pub fsync: Option<String>,
    /// Time over which SIGTERM closes the WebSocket sessions one by one
    /// (shutdown.drain_period, e.g. `15s`; `0s`: all at once)
    #[arg(long, env = "HERALD_DRAIN_PERIOD")]
    pub drain_period: Option<String>,
}

/// Read when no `--config` / `HERALD_CONFIG` is given and it exists.
pub const DEFAULT_CONFIG_FILE: &str = "herald.toml";

/// The configuration file to read: `--config` / `HERALD_CONFIG`, else
/// `./herald.toml` if there is one.
pub fn config_file(flags: &ServeFlags) -> Option<PathBuf> {
    flags.config.clone().or_else(|| {
        let p = PathBuf::from(DEFAULT_CONFIG_FILE);
        p.is_file().then_some(p)
    })
}

/// The configuration to serve with, and the deprecated keys its file used.
pub fn load(flags: &ServeFlags) -> Result<Loaded, String> {
    let Loaded { mut config, deprecations } = match config_file(flags) {
        Some(path) => read_file(&path)?,
        None => Loaded { config: Config::default(), deprecations: Vec::new() },
    };
    if let Some(listen) = &flags.listen {
        config.listen =
            listen.parse().map_err(|_| format!("--listen / HERALD_LISTEN: `{listen}` is not HOST:PORT"))?;
    }
    if let Some(dir) = &flags.data_dir {
        config.data_dir = dir.clone();
    }
    if let Some(engine) = &flags.engine {
        config.engine = match engine.as_str() {
            "embedded" => herald_server::config::EngineKind::Embedded,
            "redis" => herald_server::config::EngineKind::Redis,
            other => return Err(format!("--engine / HERALD_ENGINE: `{other}` is not `embedded` or `redis`")),
        };
    }
    if let Some(url) = &flags.redis_url {
        config.redis.url = url.clone();
    }
    if flags.dev {
        config.dev = true;
    }
    if let Some(keys) = &flags.api_keys {
        config.api_keys =
            keys.split(',').map(str::trim).filter(|k| !k.is_empty()).map(str::to_owned).collect();
    }
    if let Some(secret) = &flags.jwt_secret {
        config.jwt.hs256_secret = Some(secret.clone());
    }
    if let Some(url) = &flags.jwks_url {
        config.jwt.jwks_url = Some(url.clone());
    }
    if let Some(n) = flags.max_connections {
        config.websocket.max_connections = n;
    }
    if let Some(period) = &flags.drain_period {
        config.shutdown.drain_period = humantime::parse_duration(period)
            .map_err(|e| format!("--drain-period / HERALD_DRAIN_PERIOD: `{period}`: {e}"))?;
    }
    if let Some(mode) = &flags.fsync {
        config.storage.fsync = match mode.as_str() {
            "always" => herald_store::FsyncMode::Always,
            "never" => herald_store::FsyncMode::Never,
            other => return Err(format!("--fsync / HERALD_FSYNC: `{other}` is not `always` or `never`")),
        };
    }
    // HERALD_LOG wins over the file's `log`.
    if let Ok(log) = std::env::var("HERALD_LOG") {
        config.log = Some(log);
    }
    if let Some(log) = &config.log {
        tracing_subscriber::EnvFilter::try_new(log).map_err(|e| format!("log / HERALD_LOG: `{log}`: {e}"))?;
    }
    config.validate()?;
    Ok(Loaded { config, deprecations })
}

fn read_file(path: &Path) -> Result<Loaded, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("config {}: {e}", path.display()))?;
    Config::from_toml(&text).map_err(|e| format!("config {}: {e}", path.display()))
}

/// The default configuration as TOML, for `herald config`.
pub fn default_toml() -> String {
    let mut out = String::from(
        "# Herald configuration: every key with its default.\n\
         # Environment overrides: HERALD_LISTEN, HERALD_DATA_DIR, HERALD_ENGINE,\n\
         # HERALD_REDIS_URL (redis.url), HERALD_API_KEYS (comma-separated), HERALD_JWT_SECRET,\n\
         # HERALD_JWKS_URL (jwt.jwks_url), HERALD_DEV, HERALD_MAX_CONNECTIONS (websocket.max_connections), HERALD_FSYNC\n\
         # (storage.fsync), HERALD_DRAIN_PERIOD (shutdown.drain_period), HERALD_CONFIG. Keys of earlier layouts (`[limits]`, `redis_url`, ...)\n\
         # are still read, each with a warning naming its new key (docs/configuration.md).\n\n",
    );
    out.push_str(&toml::to_string_pretty(&Config::default()).expect("default config serialises"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_layout_parses_back_to_the_defaults_without_deprecations() {
        let text = default_toml();
        let loaded = Config::from_toml(&text).expect("`herald config` output is a valid config");
        assert!(loaded.deprecations.is_empty(), "{:?}", loaded.deprecations);
        let again = toml::to_string_pretty(&loaded.config).unwrap();
        assert!(text.ends_with(&again), "the printed layout is the default config");
        for section in
            ["[http]", "[websocket]", "[rate_limits]", "[heartbeat]", "[publish]", "[history]", "[shutdown]"]
        {
            assert!(text.contains(&format!("\n{section}\n")), "{section} is printed");
        }
        assert!(!text.contains("\n[limits]\n"));
    }

    #[test]
    fn flags_and_environment_land_on_the_new_keys() {
        let flags = ServeFlags {
            redis_url: Some("redis://flag:1".into()),
            max_connections: Some(77),
            config: Some(PathBuf::from("/nonexistent/herald.toml")),
            ..Default::default()
        };
        assert!(load(&flags).unwrap_err().contains("/nonexistent/herald.toml"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("herald.toml");
        std::fs::write(&path, "redis_url = \"redis://file:1\"\n[limits]\nmax_connections = 5\n").unwrap();
        let loaded = load(&ServeFlags { config: Some(path), ..flags }).unwrap();
        assert_eq!(loaded.config.redis.url, "redis://flag:1");
        assert_eq!(loaded.config.websocket.max_connections, 77);
        assert_eq!(loaded.deprecations.len(), 2, "{:?}", loaded.deprecations);
    }
}
