//! `[[consumers]]`: one entry per outbox consumer, checked at start.

use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};

/// Where a consumer reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConsumerKind {
    /// A PostgreSQL outbox table (`dsn`, `table`).
    Postgres,
    /// A Redis stream read through a consumer group (`url`, `stream`).
    RedisStream,
}

/// What happens to a PostgreSQL row once its message is durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AfterPublish {
    /// The row is deleted.
    Delete,
    /// The row is kept and its `herald_published_at` column set (the
    /// column must exist).
    Mark,
}

/// One `[[consumers]]` entry. Every default is here.
#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsumerConfig {
    /// 1..=64 of `[a-z0-9_-]`; the idempotency scope of its publishes and
    /// the name in the status API and the metrics.
    pub name: String,
    pub kind: Option<ConsumerKind>,
    /// `postgres`: the connection string (`postgres://user:pass@host/db` or
    /// `host=... user=...`). Plain TCP or a Unix socket, no TLS. Its
    /// password is never logged or printed.
    #[serde(serialize_with = "redacted_dsn")]
    pub dsn: String,
    /// `postgres`: the outbox table, `name` or `schema.name`.
    pub table: String,
    /// `postgres`: rows are split by channel into this many partitions,
    /// each read in id order by one owner at a time.
    pub partitions: u32,
    /// Rows (or stream entries) read and published per step.
    pub batch_size: usize,
    /// How often a partition is read when no notification woke it, and
    /// how often a node tries to take partitions it does not own.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// `postgres`: `delete` the row once its message is durable, or `mark`
    /// it (`herald_published_at`).
    pub after_publish: AfterPublish,
    /// `postgres`: where rows that cannot be published are moved. Empty:
    /// `<table>_dead`.
    pub dead_letter_table: String,
    /// `postgres`: the `LISTEN` channel a trigger notifies on commit.
    /// Empty: the table's name (without its schema).
    pub notify_channel: String,
    /// How long a node owns a partition without renewing (Redis engine: the
    /// fenced lease; another node takes over after it).
    #[serde(with = "humantime_serde")]
    pub partition_lease_ttl: Duration,
    /// Retries after a failure back off from 100 ms, doubling up to this.
    #[serde(with = "humantime_serde")]
    pub max_backoff: Duration,
    /// `redis-stream`: the Redis holding the stream (`redis://host:port`).
    #[serde(serialize_with = "redacted_dsn")]
    pub url: String,
    /// `redis-stream`: the stream key.
    pub stream: String,
    /// `redis-stream`: the consumer group (created at the stream's start
    /// if missing).
    pub group: String,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            kind: None,
            dsn: String::new(),
            table: "herald_outbox".into(),
            partitions: 1,
            batch_size: 100,
            poll_interval: Duration::from_secs(1),
            after_publish: AfterPublish::Delete,
            dead_letter_table: String::new(),
            notify_channel: String::new(),
            partition_lease_ttl: Duration::from_secs(10),
            max_backoff: Duration::from_secs(5),
            url: String::new(),
            stream: String::new(),
            group: "herald".into(),
        }
    }
}

impl std::fmt::Debug for ConsumerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerConfig")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("dsn", &redact(&self.dsn))
            .field("table", &self.table)
            .field("partitions", &self.partitions)
            .finish_non_exhaustive()
    }
}

fn redacted_dsn<S: Serializer>(dsn: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&redact(dsn))
}

/// A connection string with its password replaced: `user:<redacted>@` in
/// a URL, `password=<redacted>` in key-value form.
pub fn redact(dsn: &str) -> String {
    if let Some((scheme, rest)) = dsn.split_once("://") {
        if let Some((userinfo, host)) = rest.split_once('@') {
            if let Some((user, _)) = userinfo.split_once(':') {
                return format!("{scheme}://{user}:<redacted>@{host}");
            }
        }
        // `?password=` in the query string.
        if let Some(i) = dsn.find("password=") {
            let end = dsn[i..].find('&').map_or(dsn.len(), |e| i + e);
            return format!("{}password=<redacted>{}", &dsn[..i], &dsn[end..]);
        }
        return dsn.to_owned();
    }
    dsn.split_whitespace()
        .map(|kv| if kv.starts_with("password=") { "password=<redacted>" } else { kv })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Most partitions of one consumer.
pub const MAX_PARTITIONS: u32 = 256;
/// Largest `batch_size`.
pub const MAX_BATCH: usize = 1000;

/// A PostgreSQL identifier Herald writes into SQL as it is: lowercase
/// letters, digits and `_`, not starting with a digit, at most 63 bytes;
/// optionally `schema.name`.
fn is_table_name(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    parts.len() <= 2
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.len() <= 63
                && !p.starts_with(|c: char| c.is_ascii_digit())
                && p.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        })
}

impl ConsumerConfig {
    /// The dead-letter table's name.
    pub fn dead_letter(&self) -> String {
        if self.dead_letter_table.is_empty() {
            format!("{}_dead", self.table)
        } else {
            self.dead_letter_table.clone()
        }
    }

    /// The `LISTEN` channel.
    pub fn notify(&self) -> String {
        if self.notify_channel.is_empty() {
            self.table.rsplit('.').next().unwrap_or(&self.table).to_owned()
        } else {
            self.notify_channel.clone()
        }
    }

    /// Check one entry; the error names the consumer and the key.
    pub fn validate(&self) -> Result<(), String> {
        let n = &self.name;
        if n.is_empty()
            || n.len() > 64
            || !n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        {
            return Err(format!("consumers: name {n:?} must be 1..=64 of [a-z0-9_-]"));
        }
        if !(1..=MAX_BATCH).contains(&self.batch_size) {
            return Err(format!("consumers.{n}.batch_size must be 1..={MAX_BATCH}"));
        }
        if self.poll_interval.is_zero() || self.partition_lease_ttl.is_zero() {
            return Err(format!("consumers.{n}: poll_interval and partition_lease_ttl must be positive"));
        }
        if self.partition_lease_ttl < Duration::from_secs(1) {
            return Err(format!("consumers.{n}.partition_lease_ttl must be at least 1s"));
        }
        if self.max_backoff < Duration::from_millis(100) {
            return Err(format!("consumers.{n}.max_backoff must be at least 100ms"));
        }
        match self.kind {
            None => Err(format!("consumers.{n}.kind must be \"postgres\" or \"redis-stream\"")),
            Some(ConsumerKind::Postgres) => {
                if self.dsn.is_empty() {
                    return Err(format!("consumers.{n}.dsn must be set (postgres://user@host/db)"));
                }
                self.dsn
                    .parse::<tokio_postgres::Config>()
                    .map_err(|e| format!("consumers.{n}.dsn is not a PostgreSQL connection string ({e})"))?;
                for (key, t) in [("table", self.table.clone()), ("dead_letter_table", self.dead_letter())] {
                    if !is_table_name(&t) {
                        return Err(format!(
                            "consumers.{n}.{key} {t:?} must be a lowercase identifier ([a-z_][a-z0-9_]*, ≤ 63 bytes), optionally schema.name"
                        ));
                    }
                }
                if !is_table_name(&self.notify()) || self.notify().contains('.') {
                    return Err(format!("consumers.{n}.notify_channel must be a lowercase identifier"));
                }
                if !(1..=MAX_PARTITIONS).contains(&self.partitions) {
                    return Err(format!("consumers.{n}.partitions must be 1..={MAX_PARTITIONS}"));
                }
                Ok(())
            }
            Some(ConsumerKind::RedisStream) => {
                if !super::redis_stream::BUILT {
                    return Err(format!(
                        "consumers.{n}.kind \"redis-stream\" is not available in this build"
                    ));
                }
                if !self.url.starts_with("redis://") {
                    return Err(format!("consumers.{n}.url must be a redis:// URL"));
                }
                if self.stream.is_empty() || self.group.is_empty() {
                    return Err(format!("consumers.{n}: stream and group must be set"));
                }
                if self.partitions != 1 {
                    return Err(format!(
                        "consumers.{n}.partitions must be 1 for a redis-stream consumer (one stream is one partition)"
                    ));
                }
                Ok(())
            }
        }
    }
}

/// Check every entry and that names are unique.
pub fn validate_all(consumers: &[ConsumerConfig]) -> Result<(), String> {
    let mut names = std::collections::HashSet::new();
    for c in consumers {
        c.validate()?;
        if !names.insert(c.name.as_str()) {
            return Err(format!("consumers: name {:?} is used twice", c.name));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> ConsumerConfig {
        ConsumerConfig {
            name: "orders".into(),
            kind: Some(ConsumerKind::Postgres),
            dsn: "postgres://app:secret@127.0.0.1:5432/shop".into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_issue_contract_entry_is_valid_with_defaults() {
        let c = ok();
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.table, "herald_outbox");
        assert_eq!(c.dead_letter(), "herald_outbox_dead");
        assert_eq!(c.notify(), "herald_outbox");
        assert_eq!(c.after_publish, AfterPublish::Delete);
    }

    #[test]
    fn bad_entries_are_refused_with_the_key_named() {
        type Tweak = fn(&mut ConsumerConfig);
        let cases: Vec<(Tweak, &str)> = vec![
            (|c| c.name = "Bad".into(), "name"),
            (|c| c.kind = None, "kind"),
            (|c| c.dsn.clear(), "dsn"),
            (|c| c.table = "Orders; drop".into(), "table"),
            (|c| c.table = "a.b.c".into(), "table"),
            (|c| c.dead_letter_table = "1x".into(), "dead_letter_table"),
            (|c| c.partitions = 0, "partitions"),
            (|c| c.batch_size = 0, "batch_size"),
            (|c| c.max_backoff = Duration::from_millis(1), "max_backoff"),
        ];
        for (tweak, key) in cases {
            let mut c = ok();
            tweak(&mut c);
            let err = c.validate().expect_err(key);
            assert!(err.contains(key), "{err} names {key}");
        }
        assert!(validate_all(&[ok(), ok()]).unwrap_err().contains("twice"));
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("postgres://app:secret@h:5432/db"), "postgres://app:<redacted>@h:5432/db");
        assert_eq!(
            redact("host=h user=app password=secret dbname=db"),
            "host=h user=app password=<redacted> dbname=db"
        );
        assert_eq!(
            redact("postgres://h/db?user=a&password=s&x=1"),
            "postgres://h/db?user=a&password=<redacted>&x=1"
        );
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        let shown = format!("{:?} {}", ok(), toml::to_string(&ok()).unwrap());
        assert!(!shown.contains("secret"), "{shown}");
    }
}
