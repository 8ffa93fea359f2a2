//! What the examples share: positional arguments, a fresh engine in a temp
//! dir, the message they append, and latency figures.

use std::sync::Arc;
use std::time::Duration;

use herald_core::{AppendRequest, Retention};
use herald_proto::ChannelName;
use herald_store::{EmbeddedEngine, FsyncMode, StoreConfig};
use serde_json::value::RawValue;
use tempfile::TempDir;

/// How long a phase of an example runs at most.
pub const TIME_LIMIT: Duration = Duration::from_secs(120);
/// Calls timed per read figure.
pub const READ_SAMPLES: usize = 2000;

/// The command line's positional arguments, read in order, each with a
/// default when it is not given.
pub struct Positional(std::iter::Skip<std::env::Args>);

impl Positional {
    pub fn new() -> Self {
        Self(std::env::args().skip(1))
    }

    fn next(&mut self, default: &str) -> String {
        self.0.next().unwrap_or_else(|| default.to_owned())
    }

    pub fn num(&mut self, default: &str, what: &str) -> Result<u64, String> {
        self.next(default).parse::<u64>().map_err(|e| format!("{what}: {e}"))
    }

    pub fn fsync(&mut self, default: &str) -> Result<FsyncMode, String> {
        self.next(default).parse()
    }
}

/// An engine in a fresh temp dir (removed when the `TempDir` drops).
pub fn open_engine(fsync: FsyncMode) -> anyhow::Result<(TempDir, Arc<EmbeddedEngine>)> {
    let dir = tempfile::tempdir()?;
    let mut config = StoreConfig::new(dir.path());
    config.fsync = fsync;
    let engine = Arc::new(EmbeddedEngine::open(config)?);
    Ok((dir, engine))
}

/// A durable message of raw JSON `data` to `channel`, as the benchmarks
/// append it.
pub fn message(channel: ChannelName, data: String) -> anyhow::Result<AppendRequest> {
    Ok(AppendRequest::message(
        channel,
        RawValue::from_string(data)?,
        true,
        Retention { max_len: 10_000, max_age: None },
    ))
}

/// The `p` quantile (0..=1) of sorted samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub fn micros(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

/// Sort `samples` and print `label` with their p50 and p99 (and the max
/// when `max`).
pub fn print_latency(label: &str, samples: &mut [Duration], max: bool) {
    samples.sort_unstable();
    let (p50, p99) = (micros(percentile(samples, 0.50)), micros(percentile(samples, 0.99)));
    if max {
        println!("{label} p50 {p50}  p99 {p99}  max {}", micros(percentile(samples, 1.0)));
    } else {
        println!("{label} p50 {p50}  p99 {p99}");
    }
}
