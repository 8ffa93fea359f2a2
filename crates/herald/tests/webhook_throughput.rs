//! Prints webhook delivery figures (not a pass/fail test): run with
//! `cargo test -p herald --test webhook_throughput -- --ignored --nocapture`
//! (add `--release` for meaningful numbers).

mod webhook_backend;

use std::time::{Duration, Instant};

use herald_server::webhooks::WebhookConfig;
use herald_test_support::{assert_eventually, TestServer};
use serde_json::json;
use webhook_backend::{check_order, Backend};

const SECRET: &str = "webhook-bench-secret-0123456789abcdef";
const CHANNELS: usize = 10;
const PER_CHANNEL: u64 = 500;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "prints figures; run explicitly"]
async fn webhook_backlog_drain_rate() {
    let backend = Backend::start(SECRET).await;
    backend.refuse(); // build a backlog first
    let srv = TestServer::start_with(|c| {
        c.webhooks.push(WebhookConfig {
            name: "bench".into(),
            url: backend.url.clone(),
            channels: vec!["chat:*".into()],
            secret: SECRET.into(),
            max_backoff: Duration::from_millis(200),
            poll_interval: Duration::from_millis(100),
            ..Default::default()
        })
    })
    .await;
    let channels: Vec<String> = (0..CHANNELS).map(|i| format!("chat:bench{i}")).collect();
    for n in 0..PER_CHANNEL {
        for ch in &channels {
            assert_eq!(srv.publish(ch, json!({ "n": n, "pad": "x".repeat(100) })).await.status, 201);
        }
    }
    backend.accept_again().await;
    let t = Instant::now();
    assert_eventually("backlog drained", || async {
        channels.iter().all(|ch| backend.accepted(ch).iter().flatten().max() == Some(&PER_CHANNEL))
    })
    .await;
    let took = t.elapsed();
    for ch in &channels {
        check_order(ch, &backend.accepted(ch), false);
    }
    let total = CHANNELS as u64 * PER_CHANNEL;
    let requests = backend.with_seen(|s| s.iter().filter(|r| r.accepted).count());
    println!(
        "webhook backlog: {total} messages on {CHANNELS} channels (max_batch 100, max_parallel 16), \
         {requests} accepted requests, drained in {:.3}s = {:.0} msg/s",
        took.as_secs_f64(),
        total as f64 / took.as_secs_f64()
    );
    srv.stop().await;
}
