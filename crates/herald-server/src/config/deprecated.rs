//! Keys of earlier layouts: each is still read, moved to its new home
//! before the file is deserialised, and reported once as a [`Deprecation`].
//!
//! A setting given under both its old and its new key is an error rather
//! than a silent choice: the file says two things and only its author
//! knows which one is meant. Moving a value keeps its place in the file,
//! so an error about it still names the line it is on.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// Old key → new key, as paths in the file. `*` stands for any namespace
/// name under `namespaces` and any `[[webhooks]]` entry.
pub const RENAMED: &[(&str, &str)] = &[
    ("redis_url", "redis.url"),
    ("limits.max_http_connections", "http.max_connections"),
    ("limits.header_read_timeout", "http.header_read_timeout"),
    ("limits.body_read_timeout", "http.body_read_timeout"),
    ("limits.http_idle_timeout", "http.keep_alive_timeout"),
    ("limits.max_header_bytes", "http.max_header_bytes"),
    ("limits.max_body_bytes", "http.max_body_bytes"),
    ("limits.max_connections", "websocket.max_connections"),
    ("limits.max_message_bytes", "websocket.max_message_bytes"),
    ("limits.max_subscriptions", "websocket.max_subscriptions"),
    ("limits.max_publishes_in_flight", "websocket.max_publishes_in_flight"),
    ("limits.outbox_capacity", "websocket.outbox_capacity"),
    ("limits.outbox_bytes", "websocket.outbox_bytes"),
    ("limits.total_outbox_bytes", "websocket.total_outbox_bytes"),
    ("limits.client_frames_per_sec", "rate_limits.client_frames_per_sec"),
    ("limits.rate_limit_close_percent", "rate_limits.close_percent"),
    ("limits.rate_limit_window", "rate_limits.close_window"),
    ("limits.error_replies_per_sec", "rate_limits.error_replies_per_sec"),
    ("limits.ping_interval", "heartbeat.ping_interval"),
    ("limits.idle_timeout", "heartbeat.idle_timeout"),
    ("limits.max_data_depth", "publish.max_data_depth"),
    ("limits.max_batch_channels", "publish.max_batch_channels"),
    ("limits.max_schedule_ahead", "publish.max_schedule_ahead"),
    ("limits.max_history_limit", "history.max_limit"),
    ("limits.shutdown_grace", "shutdown.grace"),
    ("presence.lease_ttl", "presence.member_lease_ttl"),
    ("redis.lease_ttl", "redis.node_lease_ttl"),
    ("storage.max_batch", "storage.max_appends_per_commit"),
    ("namespaces.*.start", "namespaces.*.new_subscriber_start"),
    ("webhooks.*.max_batch", "webhooks.*.max_messages_per_request"),
    ("webhooks.*.start", "webhooks.*.new_channel_start"),
    ("webhooks.*.lease_ttl", "webhooks.*.channel_lease_ttl"),
];

/// Sections that no longer exist: once their keys are moved, anything left
/// in one is an unknown key.
const RETIRED_SECTIONS: &[&str] = &["limits"];

/// A key of an earlier layout found in the file, and where it lives now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deprecation {
    /// As found, e.g. `limits.ping_interval` or `webhooks[0].lease_ttl`.
    pub old: String,
    pub new: String,
}

impl fmt::Display for Deprecation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "config: `{}` is deprecated; use `{}`", self.old, self.new)
    }
}

/// What went wrong, and where in the file.
pub(super) type Failure = (String, Option<Range<usize>>);

/// Move every key of [`RENAMED`] found in `root` to its new path.
pub(super) fn migrate(root: &mut DeTable<'_>) -> Result<Vec<Deprecation>, Failure> {
    let mut found = Vec::new();
    for (old, new) in RENAMED {
        let old: Vec<&str> = old.split('.').collect();
        let new: Vec<&str> = new.split('.').collect();
        // Both paths share everything up to the last `*` (a wildcard only
        // renames a key inside the entry it matched).
        let shared = old.iter().zip(&new).take_while(|(a, b)| a == b).count().min(old.len() - 1);
        descend(root, &old[..shared], &old[shared..], &new[shared..], String::new(), &mut found)?;
    }
    for section in RETIRED_SECTIONS {
        let Some(value) = root.get(*section) else { continue };
        match value.get_ref() {
            DeValue::Table(t) => {
                if let Some((key, _)) = t.iter().next() {
                    return Err((
                        format!(
                            "unknown field `{}` in the deprecated section `[{section}]` (`herald config` prints every key)",
                            key.get_ref()
                        ),
                        Some(key.span()),
                    ));
                }
                root.remove(*section);
            }
            _ => return Err((format!("`{section}` must be a table"), Some(value.span()))),
        }
    }
    Ok(found)
}

/// Walk `prefix` (expanding `*` over a table's entries or an array's
/// items), then move `old` to `new` inside each table reached.
fn descend(
    table: &mut DeTable<'_>,
    prefix: &[&str],
    old: &[&str],
    new: &[&str],
    shown: String,
    found: &mut Vec<Deprecation>,
) -> Result<(), Failure> {
    let Some((first, rest)) = prefix.split_first() else {
        return move_key(table, old, new, &shown, found);
    };
    if *first == "*" {
        for (key, value) in table.iter_mut() {
            if let DeValue::Table(t) = value.get_mut() {
                descend(t, rest, old, new, format!("{shown}{}.", key.get_ref()), found)?;
            }
        }
        return Ok(());
    }
    let Some(value) = table.get_mut(*first) else { return Ok(()) };
    match value.get_mut() {
        DeValue::Table(t) => descend(t, rest, old, new, format!("{shown}{first}."), found),
        DeValue::Array(items) if rest.first() == Some(&"*") => {
            for (i, item) in items.iter_mut().enumerate() {
                if let DeValue::Table(t) = item.get_mut() {
                    descend(t, &rest[1..], old, new, format!("{shown}{first}[{i}]."), found)?;
                }
            }
            Ok(())
        }
        // Not what the layout has here: serde refuses it with its own error.
        _ => Ok(()),
    }
}

/// Move the key at `old` (a path of plain keys under `table`) to `new`,
/// creating the tables on the way.
fn move_key(
    table: &mut DeTable<'_>,
    old: &[&str],
    new: &[&str],
    shown: &str,
    found: &mut Vec<Deprecation>,
) -> Result<(), Failure> {
    let (old_key, old_parents) = old.split_last().expect("a key");
    let mut from = &mut *table;
    for p in old_parents {
        match from.get_mut(*p).map(Spanned::get_mut) {
            Some(DeValue::Table(t)) => from = t,
            _ => return Ok(()),
        }
    }
    let Some((key, value)) = from.remove_entry(*old_key) else { return Ok(()) };
    let (old_path, new_path) = (format!("{shown}{}", old.join(".")), format!("{shown}{}", new.join(".")));
    let (new_key, new_parents) = new.split_last().expect("a key");
    let mut to = table;
    for p in new_parents {
        let entry = to
            .entry(Spanned::new(key.span(), Cow::Owned((*p).to_owned())))
            .or_insert_with(|| Spanned::new(value.span(), DeValue::Table(DeTable::new())));
        let span = entry.span();
        match entry.get_mut() {
            DeValue::Table(t) => to = t,
            _ => return Err((format!("`{shown}{p}` must be a table"), Some(span))),
        }
    }
    if let Some((existing, _)) = to.get_key_value(*new_key) {
        return Err((
            format!("`{old_path}` (deprecated) and `{new_path}` are both set; keep only `{new_path}`"),
            Some(existing.span()),
        ));
    }
    to.insert(Spanned::new(key.span(), Cow::Owned((*new_key).to_owned())), value);
    found.push(Deprecation { old: old_path, new: new_path });
    Ok(())
}
