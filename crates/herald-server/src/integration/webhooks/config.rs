//! `[[webhooks]]`: one entry per ordered webhook, checked at start.

use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};

/// Where a webhook starts on a channel it has never delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartAt {
    /// The oldest retained message of the channel.
    Oldest,
    /// After the channel's head when the webhook first sees it: only later
    /// messages.
    Head,
}

/// One `[[webhooks]]` entry. Every default is here.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebhookConfig {
    /// 1..=64 of `[a-z0-9_-]`; the `Herald-Webhook-Id` header and the
    /// subscriber id of its cursors (`herald:webhook:<name>`).
    pub name: String,
    /// `http://` URL the batches are POSTed to.
    pub url: String,
    /// Channel patterns as in tokens: `*`, `prefix*` or an exact name.
    pub channels: Vec<String>,
    /// HMAC-SHA256 signing key, at least 32 bytes. Never logged.
    #[serde(serialize_with = "redacted")]
    pub secret: String,
    /// Per request, connect included.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Messages of one channel per request.
    pub max_messages_per_request: usize,
    /// A channel the webhook never delivered starts at its oldest retained
    /// message (`oldest`) or after its head (`head`).
    pub new_channel_start: StartAt,
    /// Retries back off from 100 ms, doubling up to this (with jitter).
    #[serde(with = "humantime_serde")]
    pub max_backoff: Duration,
    /// Channels of this webhook in flight at once on this node.
    pub max_parallel: usize,
    /// How long a node owns a channel's delivery without renewing (Redis
    /// engine: the fenced lease; another node takes over after it).
    #[serde(with = "humantime_serde")]
    pub channel_lease_ttl: Duration,
    /// How often every channel's cursor is compared with its head, to find
    /// work published on other nodes or left over from before a restart.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
}

fn redacted<S: Serializer>(_: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str("<redacted>")
}

impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("name", &self.name)
            .field("url", &self.url)
            .field("channels", &self.channels)
            .field("secret", &"<redacted>")
            .finish_non_exhaustive()
    }
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            url: String::new(),
            channels: Vec::new(),
            secret: String::new(),
            timeout: Duration::from_secs(5),
            max_messages_per_request: 100,
            new_channel_start: StartAt::Oldest,
            max_backoff: Duration::from_secs(60),
            max_parallel: 16,
            channel_lease_ttl: Duration::from_secs(15),
            poll_interval: Duration::from_secs(1),
        }
    }
}

/// Shortest accepted `secret`, in bytes.
pub const MIN_SECRET_BYTES: usize = 32;
/// Largest accepted `max_messages_per_request`.
pub const MAX_BATCH: usize = 1000;

impl WebhookConfig {
    /// Check one entry; the error names the webhook and the key.
    pub fn validate(&self) -> Result<(), String> {
        let n = &self.name;
        if n.is_empty()
            || n.len() > 64
            || !n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        {
            return Err(format!("webhooks: name {n:?} must be 1..=64 of [a-z0-9_-]"));
        }
        let url: http::Uri = self.url.parse().map_err(|e| format!("webhooks.{n}.url: not a URL ({e})"))?;
        if url.scheme_str() != Some("http") || url.host().is_none() {
            return Err(format!(
                "webhooks.{n}.url must be an http:// URL with a host (terminate TLS in front of the backend)"
            ));
        }
        if self.channels.is_empty() || self.channels.iter().any(|p| p.is_empty()) {
            return Err(format!("webhooks.{n}.channels must list at least one non-empty pattern"));
        }
        if self.secret.len() < MIN_SECRET_BYTES {
            return Err(format!("webhooks.{n}.secret must be at least {MIN_SECRET_BYTES} bytes"));
        }
        if self.timeout.is_zero() || self.channel_lease_ttl.is_zero() || self.poll_interval.is_zero() {
            return Err(format!(
                "webhooks.{n}: timeout, channel_lease_ttl and poll_interval must be positive"
            ));
        }
        if self.channel_lease_ttl < self.timeout * 2 {
            return Err(format!(
                "webhooks.{n}.channel_lease_ttl must be at least twice the timeout (a request must end well within the lease)"
            ));
        }
        if !(1..=MAX_BATCH).contains(&self.max_messages_per_request) {
            return Err(format!("webhooks.{n}.max_messages_per_request must be 1..={MAX_BATCH}"));
        }
        if self.max_parallel == 0 {
            return Err(format!("webhooks.{n}.max_parallel must be at least 1"));
        }
        if self.max_backoff < Duration::from_millis(100) {
            return Err(format!("webhooks.{n}.max_backoff must be at least 100ms"));
        }
        Ok(())
    }

    /// Whether `channel` is one of this webhook's.
    pub fn matches(&self, channel: &str) -> bool {
        self.channels.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => channel.starts_with(prefix),
            None => p == channel,
        })
    }
}

/// Check every entry and that names are unique.
pub fn validate_all(hooks: &[WebhookConfig]) -> Result<(), String> {
    let mut names = std::collections::HashSet::new();
    for h in hooks {
        h.validate()?;
        if !names.insert(h.name.as_str()) {
            return Err(format!("webhooks: name {:?} is used twice", h.name));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> WebhookConfig {
        WebhookConfig {
            name: "backend".into(),
            url: "http://127.0.0.1:9000/herald".into(),
            channels: vec!["chat:*".into(), "room:lobby".into()],
            secret: "s".repeat(32),
            ..Default::default()
        }
    }

    #[test]
    fn a_valid_entry_passes_and_matches_its_patterns() {
        let h = ok();
        assert_eq!(h.validate(), Ok(()));
        assert!(h.matches("chat:1"));
        assert!(h.matches("room:lobby"));
        assert!(!h.matches("room:lobby2"));
        assert!(!h.matches("news:1"));
    }

    #[test]
    fn bad_entries_are_refused_with_the_key_named() {
        type Tweak = fn(&mut WebhookConfig);
        let cases: Vec<(Tweak, &str)> = vec![
            (|h| h.name = "Bad".into(), "name"),
            (|h| h.name = "x".repeat(65), "name"),
            (|h| h.url = "https://x/".into(), "url"),
            (|h| h.url = "not a url".into(), "url"),
            (|h| h.channels.clear(), "channels"),
            (|h| h.secret = "short".into(), "secret"),
            (|h| h.max_messages_per_request = 0, "max_messages_per_request"),
            (|h| h.max_parallel = 0, "max_parallel"),
            (|h| h.timeout = Duration::from_secs(10), "channel_lease_ttl"),
            (|h| h.max_backoff = Duration::from_millis(1), "max_backoff"),
        ];
        for (tweak, key) in cases {
            let mut h = ok();
            tweak(&mut h);
            let err = h.validate().expect_err(key);
            assert!(err.contains(key), "{err} names {key}");
        }
        assert!(validate_all(&[ok(), ok()]).unwrap_err().contains("twice"));
    }
}
