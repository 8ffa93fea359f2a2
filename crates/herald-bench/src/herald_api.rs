//! What the bench reads from Herald's HTTP API besides publishing: a few
//! counters from `/metrics`, and the subscriber cursors of acked channels
//! (`GET /api/v1/channels/{channel}/cursors`) to check that the server
//! stored every ack. Read-only: the bench never changes the server it
//! measures.

use std::time::Duration;

use anyhow::{bail, Context};
use futures_util::StreamExt;
use herald_client::HttpApi;
use herald_proto::CursorsPage;
use tokio::time::Instant;

/// Concurrent cursor reads.
const CURSOR_READERS: usize = 16;
/// Acks are sent without waiting for a reply, so the last ones may still
/// be on their way to the store: each channel is re-read until this
/// deadline (shared by the whole check).
const CURSOR_WAIT: Duration = Duration::from_secs(10);
const CURSOR_POLL: Duration = Duration::from_millis(50);

/// Acked-delivery counters of the server, from `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AckCounters {
    /// `herald_acks_total`: acks that advanced a subscriber's cursor.
    pub acks: u64,
    /// `herald_redeliveries_total`: messages sent again after ack_timeout.
    pub redeliveries: u64,
}

impl AckCounters {
    pub async fn read(api: &HttpApi) -> anyhow::Result<AckCounters> {
        let resp = api.get("/metrics").await.context("GET /metrics failed")?;
        let resp = resp.error_for_status().context("GET /metrics")?;
        Self::parse(&String::from_utf8_lossy(&resp.body))
    }

    fn parse(text: &str) -> anyhow::Result<AckCounters> {
        let get = |name: &str| {
            metric_value(text, name)
                .with_context(|| format!("no {name} in /metrics (not a Herald with acked delivery?)"))
        };
        Ok(AckCounters {
            acks: get("herald_acks_total")? as u64,
            redeliveries: get("herald_redeliveries_total")? as u64,
        })
    }

    /// What happened between `self` and `later`.
    pub fn since(&self, earlier: &AckCounters) -> AckCounters {
        AckCounters {
            acks: self.acks.saturating_sub(earlier.acks),
            redeliveries: self.redeliveries.saturating_sub(earlier.redeliveries),
        }
    }
}

/// The value of metric `name` in a Prometheus / OpenMetrics text
/// exposition, summed over its label sets; `None` if it is not there.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else { continue };
        let rest = match rest.chars().next() {
            Some(' ') => rest,
            // Labels: skip to the closing brace (label values here never
            // contain one).
            Some('{') => match rest.find('}') {
                Some(end) => &rest[end + 1..],
                None => continue,
            },
            _ => continue, // a longer name with this prefix, e.g. `_created`
        };
        let Some(Ok(value)) = rest.split_whitespace().next().map(str::parse::<f64>) else { continue };
        found = Some(found.unwrap_or(0.0) + value);
    }
    found
}

/// Why the cursors of `channel` do not show every message up to `want`
/// acked, from a `/cursors` reply; `None` when they do.
pub fn cursor_shortfall(page: &CursorsPage, want: u64) -> Option<String> {
    if page.head != want {
        return Some(format!("head {}, want {want}", page.head));
    }
    if page.cursors.is_empty() {
        return Some("no subscriber cursor stored".to_owned());
    }
    let short: Vec<String> =
        page.cursors.iter().filter(|c| c.cursor != want).map(|c| format!("cursor {}", c.cursor)).collect();
    (!short.is_empty()).then(|| format!("{} (head {want})", short.join(", ")))
}

/// Check that on every channel the head is `want` and every stored cursor
/// reached it. Returns the channels that did not, with why (at most a few
/// examples are kept by the caller).
pub async fn verify_cursors(api: &HttpApi, channels: &[String], want: u64) -> Vec<String> {
    let deadline = Instant::now() + CURSOR_WAIT;
    futures_util::stream::iter(channels)
        .map(|channel| async move {
            loop {
                let why = match read_cursors(api, channel).await {
                    CursorRead::Body(body) => match cursor_shortfall(&body, want) {
                        None => return None,
                        Some(why) => why,
                    },
                    CursorRead::Refused(_, why) => return Some(format!("{channel}: {why}")),
                    CursorRead::Failed(why) => why,
                };
                if Instant::now() + CURSOR_POLL >= deadline {
                    return Some(format!("{channel}: {why}"));
                }
                tokio::time::sleep(CURSOR_POLL).await;
            }
        })
        .buffer_unordered(CURSOR_READERS)
        .filter_map(|r| async move { r })
        .collect()
        .await
}

/// Fail before any work if `channel` has no acked delivery on the server
/// (its namespace is durable or volatile: no cursors).
pub async fn ensure_acked(api: &HttpApi, channel: &str) -> anyhow::Result<()> {
    match read_cursors(api, channel).await {
        CursorRead::Body(_) => Ok(()),
        CursorRead::Refused(405, _) => {
            bail!("`{channel}` has no acked delivery on this server (GET cursors: 405 not_supported)")
        }
        CursorRead::Refused(_, why) | CursorRead::Failed(why) => {
            bail!("cannot read the cursors of {channel}: {why}")
        }
    }
}

/// One read of a channel's cursors.
enum CursorRead {
    Body(CursorsPage),
    /// A 4xx (status, why): asking again will not help.
    Refused(u16, String),
    /// A 5xx or a transport error: worth another try.
    Failed(String),
}

async fn read_cursors(api: &HttpApi, channel: &str) -> CursorRead {
    let resp = match api.get(&format!("/api/v1/channels/{channel}/cursors")).await {
        Ok(resp) => resp,
        Err(e) => return CursorRead::Failed(format!("GET cursors failed: {e}")),
    };
    let body = || String::from_utf8_lossy(&resp.body[..resp.body.len().min(200)]).into_owned();
    match resp.status {
        200..=299 => match serde_json::from_slice(&resp.body) {
            Ok(page) => CursorRead::Body(page),
            Err(e) => CursorRead::Failed(format!("unexpected cursors reply: {e}")),
        },
        400..=499 => {
            CursorRead::Refused(resp.status, format!("GET cursors answered {}: {}", resp.status, body()))
        }
        _ => CursorRead::Failed(format!("GET cursors answered {}: {}", resp.status, body())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPOSITION: &str = "\
# HELP herald_acks Acks that advanced a subscriber's cursor.
# TYPE herald_acks counter
herald_acks_total 1234
herald_acks_created 1700000000.0
# TYPE herald_redeliveries counter
herald_redeliveries_total{shard=\"a\"} 2
herald_redeliveries_total{shard=\"b\"} 3
herald_acks_totally_other 99
# EOF
";

    #[test]
    fn reads_counters_from_the_exposition() {
        assert_eq!(metric_value(EXPOSITION, "herald_acks_total"), Some(1234.0));
        assert_eq!(metric_value(EXPOSITION, "herald_redeliveries_total"), Some(5.0));
        assert_eq!(metric_value(EXPOSITION, "herald_missing_total"), None);
        let c = AckCounters::parse(EXPOSITION).unwrap();
        assert_eq!(c, AckCounters { acks: 1234, redeliveries: 5 });
        let later = AckCounters { acks: 1300, redeliveries: 5 };
        assert_eq!(later.since(&c), AckCounters { acks: 66, redeliveries: 0 });
        assert!(AckCounters::parse("herald_acks_total 1\n").is_err());
    }

    #[test]
    fn cursor_shortfall_wants_head_and_every_cursor_at_want() {
        let body = |head: u64, cursors: &[u64]| {
            let cursors: Vec<_> =
                cursors.iter().map(|c| serde_json::json!({"user": "u", "cursor": c})).collect();
            serde_json::from_value::<CursorsPage>(
                serde_json::json!({"channel": "user:u", "head": head, "cursors": cursors}),
            )
            .unwrap()
        };
        assert_eq!(cursor_shortfall(&body(50, &[50]), 50), None);
        assert_eq!(cursor_shortfall(&body(50, &[50, 50]), 50), None);
        assert!(cursor_shortfall(&body(50, &[49]), 50).unwrap().contains("cursor 49"));
        assert!(cursor_shortfall(&body(49, &[49]), 50).unwrap().contains("head"));
        assert!(cursor_shortfall(&body(50, &[]), 50).unwrap().contains("no subscriber cursor"));
    }
}
