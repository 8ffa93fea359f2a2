//! Live reload of the configuration: SIGHUP and `POST /api/v1/admin/reload`.
//!
//! A reload reads the configuration the way a start does (file, then the
//! environment and flags: [`Reader`], given by the binary) and compares it,
//! key by key, with the one in force. If every changed key is live
//! ([`is_live`]) the new configuration is put in force as a whole
//! (`AppState::set_config`; every live setting is read from the snapshot in
//! force where it is used), and the parts built from it at start are
//! rebuilt and swapped in (API keys, the JWT verifier, the webhooks) or
//! told (the log filter, the subscribe proxy's cache). Open connections stay up. A change
//! to any other key refuses the whole reload, naming the keys: nothing
//! changes. An invalid file is refused with the error a start would print.
//! Reloads are serialised.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::auth;
use crate::config::Config;
use crate::state::AppState;

/// Reads the configuration again: file, environment and flags.
pub type Reader = Box<dyn Fn() -> Result<Config, String> + Send + Sync>;

/// Puts a log filter in force (the binary's; `None`: its default). The
/// filter was checked when the configuration was read.
pub type LogFilter = Box<dyn Fn(Option<&str>) + Send + Sync>;

/// The keys a reload applies live, with every key under them but those in
/// [`FIXED`]. Each is read from the configuration in force where it is
/// used, or rebuilt by the reload (`api_keys`, `jwt`, `log`). Every other
/// key needs a restart (a drain, then a start): it sized or started
/// something that lives as long as the process (the listener, the engine,
/// the connection caps, the hub's byte ceiling, the heartbeat tick, the
/// room keeper's period).
pub const LIVE: &[&str] = &[
    "api_keys",
    "jwt",
    "log",
    "idempotency_ttl",
    "namespaces",
    "personal",
    "proxies",
    "websocket",
    "rate_limits",
    "publish",
    "history",
    "shutdown",
    "webhooks",
    "http.max_body_bytes",
    "presence.max_members_listed",
];

/// Keys under a [`LIVE`] one that still need a restart:
/// `jwt.leeway_secs` and `jwt.refresh_grace` are also read by every open
/// session's expiry timer;
/// `websocket.max_connections` is fitted to the open-files limit at start;
/// the outbox byte bounds are the hub's, sized at start.
pub const FIXED: &[&str] = &[
    "jwt.leeway_secs",
    "jwt.refresh_grace",
    "websocket.max_connections",
    "websocket.outbox_bytes",
    "websocket.total_outbox_bytes",
];

/// Whether a reload applies the (dotted) `key` live.
pub fn is_live(key: &str) -> bool {
    let under = |p: &&str| key == *p || key.strip_prefix(*p).is_some_and(|rest| rest.starts_with('.'));
    !FIXED.iter().any(under) && LIVE.iter().any(under)
}

/// The reload's state in [`AppState`].
#[derive(Default)]
pub struct Reloads {
    /// Set once by the binary (`Server::set_reloader`).
    pub(crate) reader: OnceLock<Reader>,
    /// Set once by the binary (`Server::set_log_filter`).
    pub(crate) log_filter: OnceLock<LogFilter>,
    /// Serialises reloads.
    lock: Mutex<()>,
}

/// A reload that was applied.
#[derive(Debug, serde::Serialize)]
pub struct Reloaded {
    /// The keys whose value changed (dotted; values never shown: they may
    /// be secrets). Empty: the file said what the node runs already.
    pub changed: Vec<String>,
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// The configuration does not load: the error a start would print.
    #[error("{0}")]
    Invalid(String),
    /// Keys that cannot change while the node runs.
    #[error("cannot change without a restart: {}", .0.join(", "))]
    NeedsRestart(Vec<String>),
    /// A namespace left out of the file while this node has subscribers
    /// on channels of it.
    #[error("namespace `{name}` is removed but {channels} of its channels have subscribers on this node: end them (or drain the node) first")]
    NamespaceInUse { name: String, channels: usize },
    /// The server was started without a way to read its configuration
    /// (embedded in a test or a program).
    #[error("this server has no configuration to reload")]
    NoReader,
}

impl AppState {
    /// Read the configuration again and apply it (see the module docs).
    /// Counted in `herald_reloads_total{result}` and logged.
    pub fn reload(&self) -> Result<Reloaded, Refused> {
        let next = match self.reloads.reader.get() {
            None => Err(Refused::NoReader),
            Some(read) => read().map_err(Refused::Invalid),
        };
        let outcome = next.and_then(|next| self.reload_with(&next));
        match &outcome {
            Ok(r) => {
                self.metrics.reloads.get_or_create(&[("result", "applied")]).inc();
                tracing::info!(changed = ?r.changed, "configuration reloaded");
            }
            Err(e) => {
                self.metrics.reloads.get_or_create(&[("result", "refused")]).inc();
                tracing::warn!(error = %e, "configuration reload refused: nothing changed");
            }
        }
        outcome
    }

    /// Apply `next` (already validated) if it changes only [`LIVE`] keys.
    pub fn reload_with(&self, next: &Config) -> Result<Reloaded, Refused> {
        let _serialised = self.reloads.lock.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.config();
        let mut changed = Vec::new();
        diff("", &to_value(current)?, &to_value(next)?, &mut changed);
        let fixed: Vec<String> = changed.iter().filter(|k| !is_live(k)).cloned().collect();
        if !fixed.is_empty() {
            return Err(Refused::NeedsRestart(fixed));
        }
        // A namespace removed while this node has subscribers on it: their
        // sessions resolve it again (acks, presence, catch-up).
        for name in current.namespaces.0.keys().filter(|n| !next.namespaces.0.contains_key(*n)) {
            let open = self.hub.channels_in(name);
            if open > 0 {
                return Err(Refused::NamespaceInUse { name: name.clone(), channels: open });
            }
        }
        // Build everything before swapping anything: a failure changes nothing.
        let jwt = auth::verifier(&next.jwt, Some(&self.jwt.load()), &self.metrics)
            .map_err(|e| Refused::Invalid(format!("jwt: {e}")))?;
        let api_keys = auth::ApiKeys::new(&next.api_keys);
        self.set_config(next.clone());
        self.jwt.store(Arc::new(jwt));
        self.api_keys.store(Arc::new(api_keys));
        if changed.iter().any(|k| k == "log") {
            if let Some(apply) = self.reloads.log_filter.get() {
                apply(next.log.as_deref());
            }
        }
        if changed.iter().any(|k| k.starts_with("proxies")) {
            self.subscribe_cache.clear();
        }
        // Always: an entry whose secret alone changed differs, though its
        // redacted form does not.
        self.webhooks.replace(&next.webhooks);
        Ok(Reloaded { changed })
    }
}

fn to_value(config: &Config) -> Result<toml::Value, Refused> {
    toml::Value::try_from(config).map_err(|e| Refused::Invalid(format!("configuration: {e}")))
}

/// The dotted keys whose values differ between `a` and `b` (tables are
/// compared key by key; anything else as a whole).
fn diff(prefix: &str, a: &toml::Value, b: &toml::Value, out: &mut Vec<String>) {
    let key = |k: &str| if prefix.is_empty() { k.to_owned() } else { format!("{prefix}.{k}") };
    match (a, b) {
        (toml::Value::Table(ta), toml::Value::Table(tb)) => {
            let mut keys: BTreeMap<&str, ()> = ta.keys().map(|k| (k.as_str(), ())).collect();
            keys.extend(tb.keys().map(|k| (k.as_str(), ())));
            for k in keys.keys() {
                match (ta.get(*k), tb.get(*k)) {
                    (Some(x), Some(y)) => diff(&key(k), x, y, out),
                    _ => out.push(key(k)),
                }
            }
        }
        _ if a != b => out.push(prefix.to_owned()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn changed(a: &str, b: &str) -> Vec<String> {
        let doc = |t: &str| toml::Value::Table(t.parse::<toml::Table>().unwrap());
        let (a, b) = (doc(a), doc(b));
        let mut out = Vec::new();
        diff("", &a, &b, &mut out);
        out
    }

    #[test]
    fn diff_names_dotted_keys_added_removed_and_changed() {
        assert!(changed("a = 1\n[t]\nx = 2\n", "a = 1\n[t]\nx = 2\n").is_empty());
        assert_eq!(changed("a = 1\n[t]\nx = 2\n", "a = 1\n[t]\nx = 3\n"), ["t.x"]);
        assert_eq!(changed("[t]\nx = 2\n", "[t]\nx = 2\ny = 1\n[u]\n"), ["t.y", "u"]);
        assert_eq!(changed("k = [\"a\"]\n", "k = [\"a\", \"b\"]\n"), ["k"]);
    }

    #[test]
    fn only_live_keys_are_live() {
        let start = Config::default();
        let mut next = Config { api_keys: vec!["a-new-key-of-16-chars".into()], ..Config::default() };
        let mut v = Vec::new();
        diff("", &to_value(&start).unwrap(), &to_value(&next).unwrap(), &mut v);
        assert_eq!(v, ["api_keys"]);
        next.listen = "127.0.0.1:1".parse().unwrap();
        next.websocket.max_connections += 1;
        let mut v = Vec::new();
        diff("", &to_value(&start).unwrap(), &to_value(&next).unwrap(), &mut v);
        let fixed: Vec<_> = v.iter().filter(|k| !is_live(k)).collect();
        assert_eq!(fixed, ["listen", "websocket.max_connections"]);
        assert!(is_live("jwt.hs256_secret") && !is_live("jwt.leeway_secs"));
        assert!(is_live("namespaces.chat.history_size") && is_live("websocket.max_message_bytes"));
        assert!(!is_live("websocket.outbox_bytes") && !is_live("http.max_connections"));
        assert!(is_live("http.max_body_bytes") && !is_live("http.max_body_bytes_x"));
    }
}
