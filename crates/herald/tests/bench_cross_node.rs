//! `herald bench` across two nodes on one Redis: the pipelined publisher
//! (`--publish-via ws`) publishes through `--publish-target` (node A) while
//! the subscribers read from `--target` (node B), so every delivery the
//! bench verifies crossed nodes.

use std::process::{Command, Stdio};

use herald_test_support::{HeraldProcess, RedisServer};

/// `herald serve --dev` on the Redis engine with the bench's config (its
/// frame budget lets a pipelined publisher through).
fn node(redis_url: &str) -> HeraldProcess {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
    cmd.args(["serve", "--dev", "--engine", "redis", "--redis-url", redis_url, "--listen", "127.0.0.1:0"])
        .arg("--config")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/herald.toml"))
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("HERALD_LOG", "warn")
        .stderr(Stdio::inherit());
    HeraldProcess::spawn(&mut cmd, Some(dir))
}

/// The node's `herald_published_total`: messages published through it.
async fn published(url: &str) -> u64 {
    let text = reqwest::get(format!("{url}/metrics")).await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("herald_published_total "))
        .map_or(0, |v| v.trim().parse::<f64>().expect("a number") as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_p2p_publishes_through_the_publish_target() {
    let redis = RedisServer::start();
    let (a, b) = (node(&redis.url()), node(&redis.url()));
    let (messages, users) = (300u64, 30);
    let bench = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["bench", "p2p", "--peer", "herald", "--dev", "--publish-via", "ws", "--namespace", "live"])
        .args(["--target", &b.url, "--publish-target", &a.url])
        .args(["--connections", &users.to_string(), "--messages", &messages.to_string(), "--size", "50"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .expect("run herald bench");
    assert!(bench.success(), "the bench verifies every delivery: {bench}");
    assert_eq!(published(&a.url).await, messages, "every publish went through node A");
    assert_eq!(published(&b.url).await, 0, "none through node B, the subscribers' node");
}
