//! Live reload of the configuration: SIGHUP and `POST /api/v1/admin/reload`.
//!
//! A reload reads the configuration the way a start does (file, then the
//! environment and flags: [`Reader`], given by the binary) and compares it,
//! key by key, with the one the node runs. The keys in [`LIVE`] are applied
//! at once: their parts of the state are rebuilt with their constructors
//! and swapped in (`arc_swap`), so the next request or upgrade uses them
//! while every open connection stays up. A change to any other key refuses
//! the whole reload, naming the keys: nothing changes. An invalid file is
//! refused with the error a start would print. Reloads are serialised.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::auth;
use crate::config::Config;
use crate::state::AppState;

/// Reads the configuration again: file, environment and flags.
pub type Reader = Box<dyn Fn() -> Result<Config, String> + Send + Sync>;

/// The top-level keys a reload applies live, with every key under them
/// but those in [`FIXED`]. Every other key needs a restart (a drain, then
/// a start).
pub const LIVE: &[&str] = &["api_keys", "jwt"];

/// Keys under a [`LIVE`] one that still need a restart:
/// `jwt.leeway_secs` is also read by every open session's expiry check.
pub const FIXED: &[&str] = &["jwt.leeway_secs"];

/// Whether a reload applies the (dotted) `key` live.
pub fn is_live(key: &str) -> bool {
    !FIXED.contains(&key) && LIVE.contains(&key.split('.').next().unwrap_or_default())
}

/// The reload's state in [`AppState`].
#[derive(Default)]
pub struct Reloads {
    /// Set once by the binary (`Server::set_reloader`).
    pub(crate) reader: OnceLock<Reader>,
    /// The configuration last applied, as TOML (`None`: the one started
    /// with). Its lock serialises reloads.
    applied: Mutex<Option<toml::Value>>,
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
        let mut applied = self.reloads.applied.lock().unwrap_or_else(|e| e.into_inner());
        let current = match &*applied {
            Some(v) => v.clone(),
            None => to_value(&self.config)?,
        };
        let wanted = to_value(next)?;
        let mut changed = Vec::new();
        diff("", &current, &wanted, &mut changed);
        let fixed: Vec<String> = changed.iter().filter(|k| !is_live(k)).cloned().collect();
        if !fixed.is_empty() {
            return Err(Refused::NeedsRestart(fixed));
        }
        // Build everything before swapping anything: a failure changes nothing.
        let jwt = auth::verifier(&next.jwt, Some(&self.jwt.load()), &self.metrics)
            .map_err(|e| Refused::Invalid(format!("jwt: {e}")))?;
        let api_keys = auth::ApiKeys::new(&next.api_keys);
        self.jwt.store(Arc::new(jwt));
        self.api_keys.store(Arc::new(api_keys));
        *applied = Some(wanted);
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
    }
}
