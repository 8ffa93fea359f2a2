//! Ordered webhooks across process death: the real binary killed with
//! SIGKILL and restarted skips nothing; two nodes on one Redis share the
//! channels, and when one is paused (SIGSTOP) past its lease or killed the
//! other takes its channels over with a greater fencing token, skipping
//! nothing.

mod webhook_backend;

use std::collections::{BTreeSet, HashMap};
use std::process::{Command, Stdio};
use std::time::Duration;

use herald_test_support::{HeraldProcess, RedisServer};
use serde_json::json;
use webhook_backend::{check_order, Backend, Mode};

const SECRET: &str = "webhook-failover-secret-0123456789abcdef";
const API_KEY: &str = "failover-api-key-0123456789";
const WAIT: Duration = Duration::from_secs(30);

/// A `herald serve` process with the backend's webhook. `engine_lines`:
/// `embedded` in a `data_dir`, or `redis` at a URL.
fn spawn_node(engine_lines: &str, backend_url: &str) -> HeraldProcess {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        r#"{engine_lines}
dev = true
api_keys = ["{API_KEY}"]

[[webhooks]]
name = "backend"
url = "{backend_url}"
channels = ["chat:*"]
secret = "{SECRET}"
timeout = "500ms"
max_batch = 5
max_backoff = "300ms"
lease_ttl = "2s"
poll_interval = "200ms"
"#
    );
    let path = dir.path().join("herald.toml");
    std::fs::write(&path, config).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&path)
        .env("HERALD_LOG", "warn")
        .stderr(Stdio::inherit());
    HeraldProcess::spawn(&mut cmd, Some(dir))
}

async fn publish(http: &reqwest::Client, node: &str, ch: &str, n: u64) -> u64 {
    let r = http
        .post(format!("{node}/api/v1/channels/{ch}/messages"))
        .bearer_auth(API_KEY)
        .json(&json!({ "data": { "n": n } }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    r.json::<serde_json::Value>().await.unwrap()["seq"].as_u64().unwrap()
}

/// Wait until every channel's accepted requests reach its head.
async fn delivered(backend: &Backend, heads: &HashMap<String, u64>) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let done = heads
            .iter()
            .all(|(ch, head)| backend.accepted(ch).iter().flatten().max().copied().unwrap_or(0) >= *head);
        if done {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "not all delivered: {heads:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// No gap, order kept, every seq 1..=head accepted at least once, signed.
fn check_all(backend: &Backend, heads: &HashMap<String, u64>) {
    for (ch, head) in heads {
        let batches = backend.accepted(ch);
        assert_eq!(check_order(ch, &batches, false), *head);
        let got: BTreeSet<u64> = batches.iter().flatten().copied().collect();
        assert_eq!(got, (1..=*head).collect(), "{ch}: every seq");
    }
    backend.with_seen(|s| assert!(s.iter().all(|r| r.signature_ok), "every request signed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_and_restart_skips_nothing() {
    let backend = Backend::start(SECRET).await;
    backend.set(Mode::Slow); // a backlog to be cut by the kill
    let data = tempfile::tempdir().unwrap();
    let engine = format!("engine = \"embedded\"\ndata_dir = {:?}", data.path().to_str().unwrap());
    let mut node = spawn_node(&engine, &backend.url);
    let http = reqwest::Client::new();
    let mut heads = HashMap::new();
    for i in 0..40 {
        for ch in ["chat:k1", "chat:k2"] {
            heads.insert(ch.to_owned(), publish(&http, &node.url, ch, i).await);
        }
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    while backend.accepted("chat:k1").len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "no delivery before the kill");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    node.kill9();
    let before = backend.with_seen(|s| s.iter().map(|r| r.token).max().unwrap());
    let delivered_before = backend.accepted("chat:k1").iter().flatten().max().copied().unwrap();
    assert!(delivered_before < heads["chat:k1"], "killed mid-delivery");
    backend.set(Mode::Ok);

    let node = spawn_node(&engine, &backend.url);
    delivered(&backend, &heads).await;
    check_all(&backend, &heads);
    let after = backend.with_seen(|s| s.iter().map(|r| r.token).max().unwrap());
    assert!(after > before, "the restarted node's fencing tokens are greater");
    drop(node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_redis_take_over_a_paused_or_killed_node_and_skip_nothing() {
    let redis = RedisServer::start();
    let backend = Backend::start(SECRET).await;
    let engine = format!("engine = \"redis\"\nredis_url = \"{}\"", redis.url());
    let mut a = spawn_node(&engine, &backend.url);
    let b = spawn_node(&engine, &backend.url);
    let http = reqwest::Client::new();
    let channels: Vec<String> = (0..6).map(|i| format!("chat:f{i}")).collect();
    let mut heads: HashMap<String, u64> = HashMap::new();
    let mut n = 0;
    // Both nodes deliver; the backend is slow so both have work in flight.
    backend.set(Mode::Slow);
    heads.extend(round(&http, &channels, &mut n, vec![a.url.clone(), b.url.clone()], 10).await);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let tokens_before: HashMap<String, u64> = token_max(&backend, &channels);

    // Pause a past its lease; b goes on alone.
    a.sigstop();
    heads.extend(round(&http, &channels, &mut n, vec![b.url.clone()], 5).await);
    backend.set(Mode::Ok);
    delivered(&backend, &heads).await;
    a.sigcont();
    tokio::time::sleep(Duration::from_millis(500)).await;
    heads.extend(round(&http, &channels, &mut n, vec![a.url.clone(), b.url.clone()], 5).await);
    delivered(&backend, &heads).await;
    check_all(&backend, &heads);

    // Any request that came after a greater token of its channel is a
    // stale node's late request: its token is the older one, so a backend
    // keeping the greatest token seen refuses it.
    let stale = backend.with_seen(|s| {
        let mut max: HashMap<&str, u64> = HashMap::new();
        let mut stale = 0;
        for r in s {
            let m = max.entry(r.body.channel.as_str()).or_default();
            if r.token < *m {
                stale += 1;
            }
            *m = (*m).max(r.token);
        }
        stale
    });
    let taken_over =
        channels.iter().filter(|ch| token_max(&backend, &channels)[*ch] > tokens_before[*ch]).count();
    println!(
        "paused node: {taken_over} channel(s) changed owner, {stale} late request(s) with an older token"
    );
    assert!(taken_over > 0, "a take-over raised the fencing token");

    // Kill a mid-delivery: b takes its channels over after the lease.
    backend.set(Mode::Slow);
    heads.extend(round(&http, &channels, &mut n, vec![a.url.clone(), b.url.clone()], 5).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.kill9();
    heads.extend(round(&http, &channels, &mut n, vec![b.url.clone()], 3).await);
    backend.set(Mode::Ok);
    delivered(&backend, &heads).await;
    check_all(&backend, &heads);
    drop(b);
}

/// `count` messages per channel, through the nodes in turn; the heads.
async fn round(
    http: &reqwest::Client,
    channels: &[String],
    n: &mut u64,
    via: Vec<String>,
    count: u64,
) -> HashMap<String, u64> {
    let mut heads = HashMap::new();
    for _ in 0..count {
        for (i, ch) in channels.iter().enumerate() {
            let node = &via[(i + *n as usize) % via.len()];
            heads.insert(ch.clone(), publish(http, node, ch, *n).await);
            *n += 1;
        }
    }
    heads
}

fn token_max(backend: &Backend, channels: &[String]) -> HashMap<String, u64> {
    backend.with_seen(|s| {
        channels
            .iter()
            .map(|ch| {
                (ch.clone(), s.iter().filter(|r| &r.body.channel == ch).map(|r| r.token).max().unwrap_or(0))
            })
            .collect()
    })
}
