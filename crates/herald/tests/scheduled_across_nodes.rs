//! Scheduled delivery on the Redis engine with two real `herald` processes
//! sharing a test-owned `redis-server`: a node killed (`kill -9`) or frozen
//! (SIGSTOP) at the due moment, with schedules it may have claimed in
//! flight; every schedule is appended exactly once (the other node takes
//! over expired claims, and the frozen node's late deliveries are fenced
//! off).

mod faults;

use std::collections::HashMap;
use std::time::Duration;

use faults::clients::http;
use faults::{spawn_herald, within, NodeOpts};
use herald_test_support::{signal, RedisServer, API_KEY};
use serde_json::{json, Value};

const CHANNELS: usize = 8;
const PER_CHANNEL: usize = 25;

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Schedule `CHANNELS * PER_CHANNEL` messages through `url`, all due at
/// `at`; returns the tags per channel.
async fn schedule_all(url: &str, prefix: &str, at: u64) -> Vec<(String, Vec<String>)> {
    let http = http();
    let mut out = Vec::new();
    for c in 0..CHANNELS {
        let ch = format!("chat:{prefix}{c}");
        let mut tags = Vec::new();
        for i in 0..PER_CHANNEL {
            let tag = format!("{c}-{i}");
            let r = http
                .post(format!("{url}/api/v1/channels/{ch}/messages"))
                .bearer_auth(API_KEY)
                .json(&json!({"data": {"tag": tag}, "deliver_at": at}))
                .send()
                .await
                .expect("schedule");
            assert_eq!(r.status().as_u16(), 202);
            tags.push(tag);
        }
        out.push((ch, tags));
    }
    out
}

async fn history(url: &str, ch: &str) -> Vec<Value> {
    let r: Value = http()
        .get(format!("{url}/api/v1/channels/{ch}/messages?limit=1000"))
        .bearer_auth(API_KEY)
        .send()
        .await
        .expect("history")
        .json()
        .await
        .expect("json");
    r["messages"].as_array().unwrap().clone()
}

async fn assert_each_once(url: &str, expected: &[(String, Vec<String>)]) {
    let all_there = within(Duration::from_secs(30), || async {
        let mut n = 0;
        for (ch, _) in expected {
            n += history(url, ch).await.len();
        }
        n >= CHANNELS * PER_CHANNEL
    })
    .await;
    assert!(all_there.is_some(), "every schedule delivered");
    for (ch, tags) in expected {
        let h = history(url, ch).await;
        let mut seen: HashMap<String, usize> = HashMap::new();
        for m in &h {
            *seen.entry(m["data"]["tag"].as_str().unwrap().to_owned()).or_default() += 1;
        }
        for t in tags {
            assert_eq!(seen.get(t), Some(&1), "{ch}: {t} appended once");
        }
        assert_eq!(h.len(), tags.len(), "{ch}: nothing else");
    }
}

async fn wait_until(at: u64) {
    while now_ms() < at {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_at_the_due_moment_leaves_each_schedule_delivered_once() {
    herald_test_support::init_tracing();
    let redis = RedisServer::start();
    let a = spawn_herald(NodeOpts::new(&redis.url()));
    let b = spawn_herald(NodeOpts::new(&redis.url()));
    let at = now_ms() + 3000;
    let expected = schedule_all(&a.url, "killed", at).await;
    wait_until(at + 5).await;
    signal(a.pid, "KILL");
    let t = std::time::Instant::now();
    assert_each_once(&b.url, &expected).await;
    eprintln!("killed node: every schedule delivered once, {:?} after the kill", t.elapsed());
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_frozen_at_the_due_moment_appends_nothing_late() {
    herald_test_support::init_tracing();
    let redis = RedisServer::start();
    let a = spawn_herald(NodeOpts::new(&redis.url()));
    let b = spawn_herald(NodeOpts::new(&redis.url()));
    let at = now_ms() + 3000;
    let expected = schedule_all(&a.url, "frozen", at).await;
    wait_until(at + 5).await;
    a.sigstop();
    assert_each_once(&b.url, &expected).await;
    // A resumes with whatever claims it held: they are fenced off.
    a.sigcont();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_each_once(&b.url, &expected).await;
    assert_each_once(&a.url, &expected).await;
}
