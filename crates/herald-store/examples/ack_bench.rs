//! Acks per second the embedded engine absorbs: `concurrency` tasks ack,
//! round after round, every message of `subscribers` subscribers (each
//! round acks the next seq of every subscriber, as clients acking each
//! delivered message would), plus the cost of the cursor reads.
//!
//! ```text
//! cargo run --release -p herald-store --example ack_bench -- \
//!     [concurrency=64] [subscribers=10000] [messages=20] [fsync=always|never] [devices_per_channel=2]
//! ```
//!
//! Subscribers are `devices_per_channel` devices of one user per channel
//! (`user:{n}`, like personal inboxes); each channel first gets `messages`
//! appends, then every subscriber acks seqs 1..=messages. Writes to a fresh
//! temp dir (removed at exit); the ack phase stops after 120 s at most.

mod common;

use std::sync::Arc;
use std::time::Instant;

use common::{message, open_engine, print_latency, Positional, READ_SAMPLES, TIME_LIMIT};
use herald_core::{Cursors, Lifecycle, Log, SubscriberId};
use herald_proto::ChannelName;
use herald_store::FsyncMode;

/// Appenders filling the channels before the ack phase (large group
/// commits, so the setup is quick).
const SETUP_CONCURRENCY: usize = 512;

struct Args {
    concurrency: usize,
    subscribers: usize,
    messages: u64,
    fsync: FsyncMode,
    devices: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut it = Positional::new();
    let args = Args {
        concurrency: it.num("64", "concurrency")? as usize,
        subscribers: it.num("10000", "subscribers")? as usize,
        messages: it.num("20", "messages")?,
        fsync: it.fsync("always")?,
        devices: it.num("2", "devices_per_channel")? as usize,
    };
    if args.concurrency == 0 || args.subscribers == 0 || args.messages == 0 || args.devices == 0 {
        return Err("every argument must be positive".into());
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args().map_err(anyhow::Error::msg)?;
    let (dir, engine) = open_engine(args.fsync)?;

    let channels = args.subscribers.div_ceil(args.devices);
    let subscribers: Arc<Vec<(ChannelName, SubscriberId)>> = Arc::new(
        (0..args.subscribers)
            .map(|i| {
                let user = (i / args.devices).to_string();
                let channel = ChannelName::new(&format!("user:{user}"))?;
                let device = Some(Arc::from(format!("device-{}", i % args.devices)));
                Ok((channel, SubscriberId::new(user, device)?))
            })
            .collect::<anyhow::Result<_>>()?,
    );
    println!(
        "ack_bench: concurrency={} subscribers={} messages={} fsync={} devices_per_channel={} \
         channels={channels} dir={}",
        args.concurrency,
        args.subscribers,
        args.messages,
        args.fsync,
        args.devices,
        dir.path().display()
    );

    // Setup: `messages` appends to every channel.
    let t0 = Instant::now();
    let setup: Vec<_> = (0..SETUP_CONCURRENCY.min(channels))
        .map(|t| {
            let (engine, messages) = (engine.clone(), args.messages);
            tokio::spawn(async move {
                for c in (t..channels).step_by(SETUP_CONCURRENCY) {
                    let channel = ChannelName::new(&format!("user:{c}"))?;
                    for _ in 0..messages {
                        engine.append(message(channel.clone(), "{\"text\":\"hello\"}".into())?).await?;
                    }
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for t in setup {
        t.await??;
    }
    println!(
        "setup:          {} appends in {:.2} s",
        channels as u64 * args.messages,
        t0.elapsed().as_secs_f64()
    );

    // Ack phase: task `t` owns subscribers t, t + C, t + 2C, ...; round `r`
    // acks seq r for each of them.
    let before = engine.stats();
    let deadline = Instant::now() + TIME_LIMIT;
    let start = Instant::now();
    let tasks: Vec<_> = (0..args.concurrency)
        .map(|t| {
            let (engine, subscribers) = (engine.clone(), subscribers.clone());
            let (concurrency, messages) = (args.concurrency, args.messages);
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                'rounds: for seq in 1..=messages {
                    for (channel, subscriber) in subscribers.iter().skip(t).step_by(concurrency) {
                        if Instant::now() >= deadline {
                            break 'rounds;
                        }
                        let t0 = Instant::now();
                        let state = engine.ack(channel, subscriber, seq).await?;
                        latencies.push(t0.elapsed());
                        anyhow::ensure!(state.seq == seq, "cursor {} after ack {seq}", state.seq);
                    }
                }
                anyhow::Ok(latencies)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await??);
    }
    let elapsed = start.elapsed();
    let after = engine.stats();
    let batches = after.batches - before.batches;
    println!("acks:           {} in {:.2} s", latencies.len(), elapsed.as_secs_f64());
    println!("throughput:     {:.0} acks/s", latencies.len() as f64 / elapsed.as_secs_f64());
    println!(
        "group commits:  {batches} (mean batch {:.1} acks), fsyncs {} (ack-sync timer)",
        (after.batch_requests - before.batch_requests) as f64 / batches.max(1) as f64,
        after.fsyncs - before.fsyncs
    );
    print_latency("ack latency:   ", &mut latencies, true);

    // Read costs on an idle engine: `cursor` inline, the lists on the
    // blocking pool.
    let (mut one, mut channel_list, mut user_list) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..READ_SAMPLES {
        let (channel, subscriber) = &subscribers[(i * 7919) % subscribers.len()];
        let t0 = Instant::now();
        let c = engine.cursor(channel, subscriber).await?;
        one.push(t0.elapsed());
        anyhow::ensure!(c.map(|c| c.seq) == Some(args.messages), "cursor of {subscriber:?}");
        let t0 = Instant::now();
        let listed = engine.cursors(channel, 100).await?;
        channel_list.push(t0.elapsed());
        anyhow::ensure!(listed.len() == args.devices.min(args.subscribers).min(100));
        let t0 = Instant::now();
        engine.user_cursors(subscriber.user(), 100).await?;
        user_list.push(t0.elapsed());
    }
    for (name, samples) in [
        ("cursor():      ", &mut one),
        ("cursors(ch):   ", &mut channel_list),
        ("user_cursors():", &mut user_list),
    ] {
        print_latency(name, samples, false);
    }
    engine.close().await;
    Ok(())
}
