//! The Redis a cluster of Herald nodes shares, read from the outside:
//! `INFO stats` and `INFO commandstats` over one plain TCP connection
//! (RESP, no client library), and its CPU from `/proc`. Read only: the
//! bench never writes to the Redis under test.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest an `INFO` round trip may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// One reading of the Redis server.
#[derive(Debug, Clone, Default)]
pub struct RedisSample {
    /// `total_commands_processed` of `INFO stats`.
    pub commands: u64,
    /// `calls` of each command of `INFO commandstats` (`xadd`, `evalsha`, …).
    pub calls: BTreeMap<String, u64>,
    /// `utime + stime` of the redis-server process, clock ticks (when its
    /// pid is known).
    pub cpu_ticks: Option<u64>,
}

impl RedisSample {
    /// Read `addr` (`HOST:PORT`) and, when given, `/proc/PID`.
    pub async fn take(addr: &str, pid: Option<u32>) -> anyhow::Result<RedisSample> {
        let text = tokio::time::timeout(TIMEOUT, info(addr))
            .await
            .with_context(|| format!("Redis at {addr} did not answer INFO in time"))??;
        let mut sample = parse_info(&text);
        sample.cpu_ticks = pid.map(crate::proc_stats::sample).transpose()?.map(|s| s.cpu_ticks);
        Ok(sample)
    }

    /// What happened between `self` and `later`: commands, calls per
    /// command (those that moved only), CPU seconds.
    pub fn delta(&self, later: &RedisSample) -> RedisDelta {
        let calls = later
            .calls
            .iter()
            .filter_map(|(name, &n)| {
                let d = n.saturating_sub(self.calls.get(name).copied().unwrap_or(0));
                (d > 0).then(|| (name.clone(), d))
            })
            .collect();
        let cpu_s = match (self.cpu_ticks, later.cpu_ticks) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / crate::proc_stats::clock_ticks_per_sec()),
            _ => None,
        };
        RedisDelta { commands: later.commands.saturating_sub(self.commands), calls, cpu_s }
    }
}

/// Redis work over a period.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RedisDelta {
    pub commands: u64,
    pub calls: BTreeMap<String, u64>,
    pub cpu_s: Option<f64>,
}

impl RedisDelta {
    /// The busiest commands, `name=calls`, most first.
    pub fn top(&self, n: usize) -> String {
        let mut v: Vec<(&String, &u64)> = self.calls.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        v.iter().take(n).map(|(k, c)| format!("{k}={c}")).collect::<Vec<_>>().join(" ")
    }
}

/// `INFO stats` and `INFO commandstats`, one bulk reply each.
async fn info(addr: &str) -> anyhow::Result<String> {
    let mut s =
        TcpStream::connect(addr).await.with_context(|| format!("cannot connect to Redis at {addr}"))?;
    let mut text = String::new();
    for section in ["stats", "commandstats"] {
        let cmd = format!("*2\r\n$4\r\nINFO\r\n${}\r\n{section}\r\n", section.len());
        s.write_all(cmd.as_bytes()).await?;
        text.push_str(&read_bulk(&mut s).await?);
    }
    Ok(text)
}

/// Read one RESP bulk string (`$LEN\r\n...\r\n`).
async fn read_bulk(s: &mut TcpStream) -> anyhow::Result<String> {
    let mut head = Vec::new();
    loop {
        let b = s.read_u8().await.context("Redis closed the connection")?;
        head.push(b);
        if head.ends_with(b"\r\n") {
            break;
        }
        if head.len() > 32 {
            bail!("Redis answered oddly: {}", String::from_utf8_lossy(&head));
        }
    }
    let line = String::from_utf8_lossy(&head[..head.len() - 2]).into_owned();
    let len: usize = match line.strip_prefix('$') {
        Some(n) => n.parse().with_context(|| format!("bad bulk length {line}"))?,
        None => bail!("Redis answered INFO with {line}"),
    };
    let mut body = vec![0; len + 2];
    s.read_exact(&mut body).await?;
    body.truncate(len);
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The counters of `INFO stats` + `INFO commandstats` text.
fn parse_info(text: &str) -> RedisSample {
    let mut sample = RedisSample::default();
    for line in text.lines().map(str::trim) {
        if let Some(v) = line.strip_prefix("total_commands_processed:") {
            sample.commands = v.parse().unwrap_or(0);
        } else if let Some(rest) = line.strip_prefix("cmdstat_") {
            // cmdstat_xadd:calls=10,usec=52,usec_per_call=5.20,...
            let Some((name, fields)) = rest.split_once(':') else { continue };
            let calls = fields.split(',').find_map(|f| f.strip_prefix("calls=")).and_then(|v| v.parse().ok());
            if let Some(calls) = calls {
                sample.calls.insert(name.to_owned(), calls);
            }
        }
    }
    sample
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "# Stats\r\ntotal_connections_received:12\r\ntotal_commands_processed:1500\r\n\
        instantaneous_ops_per_sec:3\r\n# Commandstats\r\n\
        cmdstat_evalsha:calls=100,usec=900,usec_per_call=9.00,rejected_calls=0,failed_calls=0\r\n\
        cmdstat_publish:calls=40,usec=80,usec_per_call=2.00\r\ncmdstat_info:calls=2,usec=1\r\n";

    #[test]
    fn reads_total_commands_and_calls_per_command() {
        let s = parse_info(INFO);
        assert_eq!(s.commands, 1500);
        assert_eq!(s.calls.get("evalsha"), Some(&100));
        assert_eq!(s.calls.get("publish"), Some(&40));
        assert_eq!(s.calls.len(), 3);
    }

    #[test]
    fn delta_keeps_the_commands_that_moved_busiest_first() {
        let a = parse_info(INFO);
        let b = parse_info(&INFO.replace("1500", "1800").replace("calls=100", "calls=300"));
        let d = a.delta(&b);
        assert_eq!(d.commands, 300);
        assert_eq!(d.calls.len(), 1);
        assert_eq!(d.top(3), "evalsha=200");
        assert_eq!(d.cpu_s, None);
    }
}
