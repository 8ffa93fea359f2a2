//! Acked delivery figures against a running server (dev mode):
//!
//! - `drain N`: publish N messages to one user's acked inbox while it is
//!   offline, then connect, subscribe without `since`, and ack every message
//!   as it arrives: time until the whole inbox is drained (delivery paced by
//!   acks, at most `max_inflight` outstanding).
//! - `pending CLIENTS PER_CLIENT SERVER_PID`: CLIENTS connections each
//!   receive PER_CLIENT messages and do not ack them; server RSS before and
//!   after gives the memory per pending (delivered, unacked) message, with
//!   the idle cost of the connections measured separately and subtracted.
//!
//! Usage: cargo run --release -p herald-client --example acked_figures -- \
//!          http://127.0.0.1:8700 drain 50000
//!        ... -- http://127.0.0.1:8700 pending 1000 100 <server pid>
//! Bounded in count and time; verifies order and completeness.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use herald_client::{ConnectOptions, Connection, HttpApi, ServerEvent};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url = args.first().context("usage: URL drain N | URL pending CLIENTS PER_CLIENT PID")?.clone();
    let run = format!("{:x}", std::process::id());
    match args.get(1).map(String::as_str) {
        Some("drain") => drain(&url, &run, args.get(2).context("N")?.parse()?).await,
        Some("pending") => {
            let clients: usize = args.get(2).context("CLIENTS")?.parse()?;
            let per: u64 = args.get(3).context("PER_CLIENT")?.parse()?;
            let pid: u32 = args.get(4).context("PID")?.parse()?;
            pending(&url, &run, clients, per, pid).await
        }
        _ => bail!("usage: URL drain N | URL pending CLIENTS PER_CLIENT PID"),
    }
}

async fn publish_many(api: &HttpApi, channels: &[String], per: u64) -> anyhow::Result<()> {
    let mut tasks = Vec::new();
    for worker in 0..32usize {
        let (api, channels) = (api.clone(), channels.to_vec());
        tasks.push(tokio::spawn(async move {
            for (i, ch) in channels.iter().enumerate() {
                for n in 0..per {
                    if (i as u64 * per + n) as usize % 32 == worker {
                        api.publish(ch, &json!({ "n": n }), None, None).await?;
                    }
                }
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

async fn drain(url: &str, run: &str, n: u64) -> anyhow::Result<()> {
    let api = HttpApi::anonymous(url);
    let user = format!("drain-{run}");
    let channel = format!("user:{user}");
    let t = Instant::now();
    // Publish in order (one publisher) so seqs match `n`; the inbox is
    // offline: nobody is subscribed.
    publish_many(&api, std::slice::from_ref(&channel), n).await?;
    println!("published {n} in {:.1}s", t.elapsed().as_secs_f64());

    let mut c = Connection::connect(&ConnectOptions::dev_user(url, &user)).await?;
    let started = Instant::now();
    let ok = c.subscribe(&channel, None).await?;
    if ok.unread != Some(n) {
        bail!("expected unread {n}, got {:?}", ok.unread);
    }
    let mut expected = 1;
    while expected <= n {
        let ev = tokio::time::timeout(WAIT, c.next_frame()).await.context("drain stalled")??;
        let Some(ServerEvent::Frame(f)) = ev else { bail!("connection ended at seq {expected}") };
        if f.kind != "message" {
            continue;
        }
        if f.seq != Some(expected) {
            bail!("out of order: expected {expected}, got {:?}", f.seq);
        }
        c.send(&json!({ "type": "ack", "channel": channel, "seq": expected })).await?;
        expected += 1;
    }
    let secs = started.elapsed().as_secs_f64();
    println!("drained {n} messages (acking each) in {secs:.2}s: {:.0} msg/s", n as f64 / secs);
    Ok(())
}

fn rss_kb(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("VmRSS")?;
    Ok(line.split_whitespace().nth(1).context("value")?.parse()?)
}

async fn pending(url: &str, run: &str, clients: usize, per: u64, pid: u32) -> anyhow::Result<()> {
    let api = HttpApi::anonymous(url);
    let users: Vec<String> = (0..clients).map(|i| format!("p{run}-{i}")).collect();
    let channels: Vec<String> = users.iter().map(|u| format!("user:{u}")).collect();
    // Fill the log first, so storage growth is not counted as pending state.
    publish_many(&api, &channels, per).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut conns = Vec::with_capacity(clients);
    for u in &users {
        conns.push(Connection::connect(&ConnectOptions::dev_user(url, u)).await?);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = rss_kb(pid)?;
    // Subscribing delivers every message; nobody acks, so all stay pending
    // (with their redelivery timers) until ack_timeout.
    let started = Instant::now();
    let mut total = 0u64;
    for (c, ch) in conns.iter_mut().zip(&channels) {
        c.subscribe(ch, None).await?;
    }
    for c in conns.iter_mut() {
        let mut got = 0;
        while got < per {
            let ev = tokio::time::timeout(WAIT, c.next_frame()).await.context("stalled")??;
            if let Some(ServerEvent::Frame(f)) = ev {
                if f.kind == "message" && f.redelivered.is_none() {
                    got += 1;
                }
            }
        }
        total += got;
    }
    let after = rss_kb(pid)?;
    let elapsed = started.elapsed();
    if elapsed > Duration::from_secs(9) {
        println!("warning: {elapsed:?} elapsed; redeliveries (ack_timeout 10s) may have started");
    }
    let per_msg = (after.saturating_sub(before)) as f64 * 1024.0 / total as f64;
    println!(
        "{total} pending unacked messages over {clients} subscriptions: RSS {before} KB -> {after} KB, \
         {per_msg:.0} bytes per pending message (subscription state included)"
    );
    Ok(())
}
