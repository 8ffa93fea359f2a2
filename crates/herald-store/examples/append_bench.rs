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

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use common::{message, open_engine, print_latency, Positional, READ_SAMPLES, TIME_LIMIT};
use herald_core::{Lifecycle, Log};
use herald_proto::ChannelName;
use herald_store::FsyncMode;

struct Args {
    concurrency: usize,
    total: u64,
    payload: usize,
    fsync: FsyncMode,
    channels: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut it = Positional::new();
    let args = Args {
        concurrency: it.num("64", "concurrency")? as usize,
        total: it.num("100000", "total")?,
        payload: it.num("200", "payload_bytes")? as usize,
        fsync: it.fsync("always")?,
        channels: it.num("16", "channels")? as usize,
    };
    if args.concurrency == 0 || args.channels == 0 {
        return Err("concurrency and channels must be positive".into());
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args().map_err(anyhow::Error::msg)?;
    let (dir, engine) = open_engine(args.fsync)?;

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
                let req = message(ch.clone(), data.to_string())?;
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
    print_latency("append latency:", &mut latencies, true);

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
    print_latency("position():    ", &mut pos, false);
    print_latency("read(100):     ", &mut page, false);
    engine.close().await;
    Ok(())
}
