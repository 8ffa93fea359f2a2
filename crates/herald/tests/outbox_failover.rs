//! Two `herald serve` nodes on one Redis share a PostgreSQL outbox
//! consumer, one owner per partition: the owner frozen by SIGSTOP past its
//! lease is replaced by the other node with greater fencing tokens, and its
//! late batch, when it wakes, appends nothing twice and removes nothing;
//! later the new owner is killed with SIGKILL and the first takes its
//! partitions back. Every committed row reaches the subscriber once, per
//! channel in row-id order, and no row is left behind.

mod outbox_backend;

use std::time::Duration;

use herald_test_support::{assert_eventually, PostgresServer, RedisServer};
use outbox_backend::*;

const PARTITIONS: usize = 4;

fn config(redis: &str, dsn: &str) -> String {
    format!(
        r#"engine = "redis"

[redis]
url = "{redis}"

[[consumers]]
name = "orders"
kind = "postgres"
dsn = "{dsn}"
partitions = {PARTITIONS}
batch_size = 20
poll_interval = "200ms"
partition_lease_ttl = "2s"
max_backoff = "300ms"
"#
    )
}

/// Partitions `url` owns now, with their tokens.
async fn owned(url: &str) -> Vec<(u64, u64)> {
    let s = api_get(url, "/api/v1/consumers").await;
    s["consumers"][0]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["owned"] == true)
        .map(|p| (p["partition"].as_u64().unwrap(), p["token"].as_u64().unwrap()))
        .collect()
}

async fn fences(pg: &tokio_postgres::Client) -> Vec<i64> {
    pg.query("SELECT fence FROM herald_consumer_state WHERE consumer = 'orders' ORDER BY partition", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_paused_past_its_lease_or_killed_hands_its_partitions_over_without_a_double() {
    const CHANNELS: usize = 12;
    let redis = RedisServer::start();
    let pg = PostgresServer::start();
    let admin = pg.connect().await;
    admin.batch_execute(DDL).await.unwrap();
    let cfg = config(&redis.url(), &pg.dsn());
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];

    let first = spawn_herald(0, &cfg, dirs[0].path());
    let url = first.url.clone();
    assert_eventually("the first node owns every partition", || async {
        owned(&url).await.len() == PARTITIONS
    })
    .await;
    let mut nodes = [first, spawn_herald(0, &cfg, dirs[1].path())];
    let subscribers =
        [subscriber(&nodes[0].url, "s0", CHANNELS).await, subscriber(&nodes[1].url, "s1", CHANNELS).await];

    let backend = Backend::new();
    let writers = backend.spawn_writers(&pg.dsn(), 3, 700, CHANNELS, Duration::from_millis(3), false);

    // Freeze the node owning the most partitions (likely mid-batch) past
    // its lease: the other takes every partition with greater tokens.
    committed_at_least(&backend.ledger, 300).await;
    let frozen = if owned(&nodes[0].url).await.len() >= owned(&nodes[1].url).await.len() { 0 } else { 1 };
    let other = 1 - frozen;
    let held: Vec<u64> = owned(&nodes[frozen].url).await.iter().map(|(p, _)| *p).collect();
    let before = fences(&admin).await;
    nodes[frozen].sigstop();
    let url = nodes[other].url.clone();
    assert_eventually("the other node owns every partition", || async {
        owned(&url).await.len() == PARTITIONS
    })
    .await;
    let taken = fences(&admin).await;
    for p in &held {
        let p = *p as usize;
        assert!(taken[p] > before[p], "partition {p}: a greater token: {before:?} -> {taken:?}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    nodes[frozen].sigcont();

    // Kill the new owner: the woken node takes the partitions back.
    committed_at_least(&backend.ledger, 1200).await;
    nodes[other].kill9();
    let url = nodes[frozen].url.clone();
    let (admin_ref, taken_ref) = (&admin, &taken);
    assert_eventually("the woken node owns every partition again, with greater tokens", || async {
        let back = fences(admin_ref).await;
        owned(&url).await.len() == PARTITIONS && back.iter().zip(taken_ref).all(|(n, t)| n > t)
    })
    .await;
    let back = fences(&admin).await;

    for w in writers {
        w.await.unwrap();
    }
    let ledger = backend.ledger.clone();
    let got = &subscribers[frozen].1;
    if let Err(e) = all_received(&ledger, got, "subscriber of the frozen node").await {
        explain(e, &admin, &nodes[frozen].url).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    check(&ledger.lock().unwrap(), &got.lock().unwrap(), "subscriber of the frozen node");
    assert_eq!(outbox_rows(&admin).await, 0, "no row left behind");
    let metrics = reqwest::get(format!("{}/metrics", nodes[frozen].url)).await.unwrap().text().await.unwrap();
    let duplicates = metrics
        .lines()
        .find_map(|l| l.strip_prefix("herald_consumer_duplicates_total{consumer=\"orders\"} "))
        .unwrap_or("0")
        .to_owned();
    println!(
        "{} rows committed; fences {before:?} -> {taken:?} -> {back:?}; rows the frozen node found appended already: {duplicates}",
        ledger.lock().unwrap().committed.len()
    );
}
