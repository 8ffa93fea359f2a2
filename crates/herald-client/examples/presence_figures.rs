//! Presence figures against a running server (dev mode): one room, N
//! members.
//!
//! 1. **Joins**: N connections join the room, `CONCURRENCY` at a time. Each
//!    new member's `join` is pushed to every member already present, so the
//!    phase delivers at least N(N+1)/2 join frames (more where two members
//!    join at the same moment and each sees the other). The run fails unless
//!    every member saw its own join, no join twice, and for every pair at
//!    least one of the two saw the other's.
//! 2. **Listing**: `GET /api/v1/channels/{room}/presence` (full list, up to
//!    the server's `presence.max_members_listed`) and `?count=1`, timed over
//!    `LIST_ROUNDS` calls each.
//! 3. **Leaves**: every member closes cleanly; each close pushes a `leave`
//!    to the members still present.
//!
//! Usage: cargo run --release -p herald-client --example presence_figures -- \
//!          http://127.0.0.1:8700 5000
//! (run the server with `presence.max_members_listed` at least N to time a
//! full listing). Bounded in count and time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use herald_client::{ConnectOptions, Connection, HttpApi, ServerEvent};
use serde_json::json;
use tokio::sync::{mpsc, watch};

const CONCURRENCY: usize = 64;
const LIST_ROUNDS: usize = 20;
const WAIT: Duration = Duration::from_secs(300);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url = args.first().context("usage: URL MEMBERS")?.clone();
    let n: u64 = args.get(1).context("usage: URL MEMBERS")?.parse()?;
    let room = format!("room:presence-{:x}", std::process::id());
    let api = HttpApi::anonymous(&url);
    let body = bytes::Bytes::from(json!({ "host": "nobody", "grace_period": 3600 }).to_string());
    let r = api.request(reqwest::Method::PUT, &format!("/api/v1/rooms/{room}"), &[], Some(body)).await?;
    if r.status != 201 {
        bail!("create room: {} {}", r.status, String::from_utf8_lossy(&r.body));
    }

    // Phase 1: joins.
    let joins_seen = Arc::new(AtomicU64::new(0));
    let leaves_seen = Arc::new(AtomicU64::new(0));
    let (stop_tx, stop_rx) = watch::channel(false);
    let (done_tx, mut done_rx) = mpsc::channel::<anyhow::Result<(u64, Vec<u64>)>>(n as usize);
    let started = Instant::now();
    let permits = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let mut joined_at = Vec::new();
    for i in 0..n {
        let permit = permits.clone().acquire_owned().await?;
        let (url, room) = (url.clone(), room.clone());
        let (joins, leaves, done) = (joins_seen.clone(), leaves_seen.clone(), done_tx.clone());
        let mut stop = stop_rx.clone();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        joined_at.push(ready_rx);
        tokio::spawn(async move {
            let result = async {
                let mut c = Connection::connect(&ConnectOptions::dev_user(&url, format!("m{i}"))).await?;
                let ok = c.request(json!({ "type": "subscribe", "channel": room, "client_id": "c" })).await?;
                if ok.kind != "ok" {
                    bail!("subscribe: {ok:?}");
                }
                drop(permit);
                let _ = ready_tx.send(());
                let mut seen = Vec::new();
                loop {
                    tokio::select! {
                        _ = stop.changed() => break,
                        ev = c.next_frame() => match ev? {
                            Some(ServerEvent::Frame(f)) if f.kind == "join" => {
                                let user = f.member.context("join without member")?.user;
                                seen.push(user.strip_prefix('m').context("member name")?.parse::<u64>()?);
                                joins.fetch_add(1, Ordering::Relaxed);
                            }
                            Some(ServerEvent::Frame(f)) if f.kind == "leave" => { leaves.fetch_add(1, Ordering::Relaxed); }
                            Some(ServerEvent::Frame(_)) => {}
                            other => bail!("member {i}: connection ended: {other:?}"),
                        },
                    }
                }
                c.close(Some(1000), "done").await?;
                // Keep reading until the server closes, so the close is clean.
                while let Ok(Ok(Some(_))) = tokio::time::timeout(Duration::from_secs(5), c.next_frame()).await {}
                Ok((i, seen))
            }
            .await;
            let _ = done.send(result).await;
        });
    }
    for r in joined_at {
        tokio::time::timeout(WAIT, r).await?.context("a member failed to join")?;
    }
    let subscribed = started.elapsed();
    let expected_joins = n * (n + 1) / 2;
    wait_for(&joins_seen, expected_joins, "join frames").await?;
    let joins_elapsed = started.elapsed();
    // Concurrent joiners may each see the other: wait until it settles.
    let mut last = joins_seen.load(Ordering::Relaxed);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = joins_seen.load(Ordering::Relaxed);
        if now == last {
            break;
        }
        last = now;
    }
    let expected_joins = last;
    println!(
        "joins: {n} members in {:.2}s ({:.0} joins/s subscribed; all {} join frames delivered after {:.2}s, {:.0} frames/s)",
        subscribed.as_secs_f64(),
        n as f64 / subscribed.as_secs_f64(),
        expected_joins,
        joins_elapsed.as_secs_f64(),
        expected_joins as f64 / joins_elapsed.as_secs_f64(),
    );

    // Phase 2: listing.
    for (label, query) in [("full list", ""), ("count only", "?count=1")] {
        let mut times = Vec::new();
        let mut listed = 0;
        for _ in 0..LIST_ROUNDS {
            let t = Instant::now();
            let r = api.get(&format!("/api/v1/channels/{room}/presence{query}")).await?;
            times.push(t.elapsed());
            let v = r.json()?;
            if v["count"] != n {
                bail!("presence count {} != {n}", v["count"]);
            }
            listed = v["members"].as_array().map_or(0, Vec::len);
        }
        times.sort();
        println!(
            "presence {label}: {listed} members listed, p50 {:.2} ms, max {:.2} ms over {LIST_ROUNDS} calls",
            times[times.len() / 2].as_secs_f64() * 1e3,
            times[times.len() - 1].as_secs_f64() * 1e3,
        );
    }

    // Phase 3: leaves (all at once: each leave reaches those still present).
    let t = Instant::now();
    stop_tx.send(true)?;
    drop(done_tx);
    let mut ok = 0;
    let words = (n * n).div_ceil(64) as usize;
    let mut saw = vec![0u64; words]; // saw[i * n + j]: member i saw j's join
    while let Some(r) = tokio::time::timeout(WAIT, done_rx.recv()).await? {
        let (i, mut seen) = r?;
        let len = seen.len();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != len {
            bail!("member {i} saw a join twice");
        }
        for j in seen {
            let bit = i * n + j;
            saw[(bit / 64) as usize] |= 1 << (bit % 64);
        }
        ok += 1;
    }
    let has = |i: u64, j: u64| saw[((i * n + j) / 64) as usize] & (1 << ((i * n + j) % 64)) != 0;
    for i in 0..n {
        if !has(i, i) {
            bail!("member {i} did not see its own join");
        }
        for j in i + 1..n {
            if !has(i, j) && !has(j, i) {
                bail!("neither member {i} nor {j} saw the other join");
            }
        }
    }
    println!(
        "verified: every member saw its own join, none twice, every pair saw each other at least one way"
    );
    let mut count = json!(null);
    for _ in 0..500 {
        count = api.get(&format!("/api/v1/channels/{room}/presence?count=1")).await?.json()?["count"].clone();
        if count == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let leaves_elapsed = t.elapsed();
    println!(
        "leaves: {ok} members closed cleanly in {:.2}s ({:.0} leaves/s); {} leave frames seen; presence count after: {count}",
        leaves_elapsed.as_secs_f64(),
        ok as f64 / leaves_elapsed.as_secs_f64(),
        leaves_seen.load(Ordering::Relaxed),
    );
    if count != 0 {
        bail!("members left behind: {count}");
    }
    Ok(())
}

async fn wait_for(counter: &AtomicU64, target: u64, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + WAIT;
    while counter.load(Ordering::Relaxed) < target {
        if Instant::now() > deadline {
            bail!("{what}: {} of {target} after {WAIT:?}", counter.load(Ordering::Relaxed));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
