//! Append throughput and latency of the embedded engine, plus the cost of
//! the read calls (which decides `position` inline vs `read` on the blocking
//! pool).
//!
//! ```text
//! cargo run --release -p herald-store --example append_bench -- \
//!     [concurrency=64] [total=100000] [payload_bytes=200] [fsync=always|never] [channels=16]
//! ```
//!
//! Writes to a fresh temp dir (removed at exit). Stops after `total`
//! appends or 120 s, whichever comes first.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_core::{AppendRequest, Lifecycle, Log, Retention};
use herald_proto::ChannelName;
use herald_store::{EmbeddedEngine, FsyncMode, StoreConfig};
use serde_json::value::RawValue;

const TIME_LIMIT: Duration = Duration::from_secs(120);
const READ_SAMPLES: usize = 2000;

struct Args {
    concurrency: usize,
    total: u64,
    payload: usize,
    fsync: FsyncMode,
    channels: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut next = |default: &str| it.next().unwrap_or_else(|| default.to_owned());
    let num = |s: String, what: &str| s.parse::<u64>().map_err(|e| format!("{what}: {e}"));
    let args = Args {
        concurrency: num(next("64"), "concurrency")? as usize,
        total: num(next("100000"), "total")?,
        payload: num(next("200"), "payload_bytes")? as usize,
        fsync: next("always").parse()?,
        channels: num(next("16"), "channels")? as usize,
    };
    if args.concurrency == 0 || args.channels == 0 {
        return Err("concurrency and channels must be positive".into());
    }
    Ok(args)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx]
}

fn micros(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args().map_err(anyhow::Error::msg)?;
    let dir = tempfile::tempdir()?;
    let mut config = StoreConfig::new(dir.path());
    config.fsync = args.fsync;
    let engine = Arc::new(EmbeddedEngine::open(config)?);

    // A JSON string of `payload` bytes in total.
    let data = format!("\"{}\"", "x".repeat(args.payload.saturating_sub(2)));
    let data: Arc<str> = Arc::from(data);
    let channels: Arc<Vec<ChannelName>> = Arc::new(
        (0..args.channels).map(|i| ChannelName::new(&format!("bench:{i}"))).collect::<Result<_, _>>()?,
    );
    let issued = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + TIME_LIMIT;

    println!(
        "append_bench: concurrency={} total={} payload={}B fsync={} channels={} dir={}",
        args.concurrency,
        args.total,
        args.payload,
        args.fsync,
        args.channels,
        dir.path().display()
    );
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(args.concurrency);
    for t in 0..args.concurrency {
        let (engine, data, channels, issued) =
            (engine.clone(), data.clone(), channels.clone(), issued.clone());
        let total = args.total;
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let ch = &channels[t % channels.len()];
            while issued.fetch_add(1, Ordering::Relaxed) < total && Instant::now() < deadline {
                let req = AppendRequest::message(
                    ch.clone(),
                    RawValue::from_string(data.to_string())?,
                    true,
                    Retention { max_len: 10_000, max_age: None },
                );
                let t0 = Instant::now();
                engine.append(req).await?;
                latencies.push(t0.elapsed());
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await??);
    }
    let elapsed = start.elapsed();
    latencies.sort_unstable();
    let stats = engine.stats();
    let n = latencies.len() as f64;
    println!("appends:        {} in {:.2} s", latencies.len(), elapsed.as_secs_f64());
    println!("throughput:     {:.0} appends/s", n / elapsed.as_secs_f64());
    println!(
        "group commits:  {} (mean batch {:.1} appends), fsyncs {}",
        stats.batches,
        stats.batch_requests as f64 / stats.batches.max(1) as f64,
        stats.fsyncs
    );
    println!(
        "append latency: p50 {}  p99 {}  max {}",
        micros(percentile(&latencies, 0.50)),
        micros(percentile(&latencies, 0.99)),
        micros(percentile(&latencies, 1.0))
    );

    // Read costs, on an idle engine: `position` runs inline on the caller's
    // task, `read` goes through `spawn_blocking`.
    let mut pos = Vec::with_capacity(READ_SAMPLES);
    let mut page = Vec::with_capacity(READ_SAMPLES);
    for i in 0..READ_SAMPLES {
        let ch = &channels[i % channels.len()];
        let t0 = Instant::now();
        let p = engine.position(ch).await?;
        pos.push(t0.elapsed());
        let t0 = Instant::now();
        let got = engine.read(ch, p.head.saturating_sub(100), 100).await?;
        page.push(t0.elapsed());
        assert!(got.messages.len() <= 100);
    }
    pos.sort_unstable();
    page.sort_unstable();
    println!(
        "position():     p50 {}  p99 {}",
        micros(percentile(&pos, 0.50)),
        micros(percentile(&pos, 0.99))
    );
    println!(
        "read(100):      p50 {}  p99 {}",
        micros(percentile(&page, 0.50)),
        micros(percentile(&page, 0.99))
    );
    engine.close().await;
    Ok(())
}
