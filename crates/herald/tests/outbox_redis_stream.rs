//! The Redis Streams consumer against a test-owned `redis-server` and real
//! `herald serve` processes: writers add entries across channels while a
//! subscriber listens; Herald is killed with SIGKILL and restarted; a
//! poisoned entry is parked; two nodes share the stream and the owner,
//! frozen by SIGSTOP past its lease, hands it over with its pending
//! entries. Every entry reaches the subscriber once, per channel in stream
//! order, and nothing is left pending.

mod outbox_backend;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_test_support::{assert_eventually, RedisServer};
use outbox_backend::*;

fn consumer(url: &str) -> String {
    format!(
        r#"
[[consumers]]
name = "orders"
kind = "redis-stream"
url = "{url}"
stream = "app:outbox"
group = "herald"
batch_size = 20
poll_interval = "1s"
partition_lease_ttl = "2s"
max_backoff = "300ms"
"#
    )
}

/// `ms-seq` as one number in stream order.
fn order(id: &str) -> i64 {
    let (ms, seq) = id.split_once('-').unwrap();
    ms.parse::<i64>().unwrap() * 100_000 + seq.parse::<i64>().unwrap()
}

/// `writers` tasks adding `entries` entries each over `channels`; with
/// `poison`, one entry of an unknown namespace.
fn spawn_writers(
    url: &str,
    ledger: &Arc<Mutex<Ledger>>,
    writers: usize,
    entries: usize,
    channels: usize,
    poison: bool,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..writers)
        .map(|w| {
            let (url, ledger) = (url.to_owned(), ledger.clone());
            tokio::spawn(async move {
                let client = redis::Client::open(url.as_str()).unwrap();
                // Far above the client's 500 ms default: on a loaded machine an
                // `XADD` under `appendfsync always` can take longer, and a
                // timed-out one would leave its outcome unknown.
                let config =
                    redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
                let mut con = client.get_multiplexed_async_connection_with_config(&config).await.unwrap();
                for i in 0..entries {
                    let (channel, tag) = if poison && w == 0 && i == 10 {
                        ("nope:1".to_owned(), "poison".to_owned())
                    } else {
                        (format!("orders:{}", fastrand::usize(..channels)), format!("{w}-{i}"))
                    };
                    let data = format!("{{\"tag\":\"{tag}\"}}");
                    let id: String = redis::cmd("XADD")
                        .arg("app:outbox")
                        .arg("*")
                        .arg("channel")
                        .arg(&channel)
                        .arg("data")
                        .arg(&data)
                        .query_async(&mut con)
                        .await
                        .unwrap();
                    {
                        let mut l = ledger.lock().unwrap();
                        if tag == "poison" {
                            l.poisoned.insert(tag);
                        } else {
                            l.committed.push(Committed { id: order(&id), channel, tag });
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        })
        .collect()
}

fn pending(redis: &RedisServer) -> String {
    redis.cli(&["XPENDING", "app:outbox", "herald"]).lines().next().unwrap_or_default().to_owned()
}

async fn owns(url: &str) -> bool {
    api_get(url, "/api/v1/consumers").await["consumers"][0]["partitions"][0]["owned"] == true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_entries_arrive_once_in_order_through_kill_9_and_a_poisoned_entry() {
    const CHANNELS: usize = 10;
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = format!(
        "engine = \"embedded\"\ndata_dir = {:?}\n{}",
        dir.path().join("data"),
        consumer(&redis.url())
    );
    let mut herald = spawn_herald(port, &config, dir.path());
    let (_s, got) = subscriber(&herald.url, "s", CHANNELS).await;
    let ledger: Arc<Mutex<Ledger>> = Arc::default();
    let writers = spawn_writers(&redis.url(), &ledger, 3, 500, CHANNELS, true);
    committed_at_least(&ledger, 500).await;
    herald.kill9();
    tokio::time::sleep(Duration::from_millis(300)).await;
    herald = spawn_herald(port, &config, dir.path());
    for w in writers {
        w.await.unwrap();
    }
    all_received(&ledger, &got, "s").await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    check(&ledger.lock().unwrap(), &got.lock().unwrap(), "s");
    assert_eq!(pending(&redis), "0", "nothing left pending");
    let dead = redis.cli(&["XRANGE", "app:outbox:dead", "-", "+"]);
    assert!(dead.contains("unknown_namespace") && dead.contains("nope:1"), "{dead}");
    let url = herald.url.clone();
    assert_eventually("the status shows the stream owned, no lag, one parked entry", || async {
        let p = api_get(&url, "/api/v1/consumers").await["consumers"][0]["partitions"][0].clone();
        p["owned"] == true && p["lag"] == 0 && p["parked_rows"] == 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_hands_the_stream_and_its_pending_entries_over() {
    const CHANNELS: usize = 10;
    let redis = RedisServer::start();
    let config =
        format!("engine = \"redis\"\n{}\n[redis]\nurl = \"{}\"\n", consumer(&redis.url()), redis.url());
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let first = spawn_herald(0, &config, dirs[0].path());
    let url = first.url.clone();
    assert_eventually("the first node owns the stream", || owns(&url)).await;
    let nodes = [first, spawn_herald(0, &config, dirs[1].path())];
    let (_s, got) = subscriber(&nodes[1].url, "s", CHANNELS).await;
    let ledger: Arc<Mutex<Ledger>> = Arc::default();
    let writers = spawn_writers(&redis.url(), &ledger, 3, 500, CHANNELS, false);

    committed_at_least(&ledger, 300).await;
    nodes[0].sigstop();
    let url = nodes[1].url.clone();
    assert_eventually("the second node owns the stream", || owns(&url)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    nodes[0].sigcont();
    for w in writers {
        w.await.unwrap();
    }
    all_received(&ledger, &got, "s").await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    check(&ledger.lock().unwrap(), &got.lock().unwrap(), "s");
    assert_eq!(pending(&redis), "0", "nothing left pending");
    let url = nodes[0].url.clone();
    assert!(!owns(&url).await, "the woken node does not own the stream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_with_channels_reaches_each_of_them_once_and_deliver_at_is_parked() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "engine = \"embedded\"\ndata_dir = {:?}\n{}",
        dir.path().join("data"),
        consumer(&redis.url())
    );
    let herald = spawn_herald(0, &config, dir.path());
    let (_s, got) = subscriber(&herald.url, "s", 3).await;
    let ledger: Arc<Mutex<Ledger>> = Arc::default();
    // Each entry's fields (besides `data`) and the channels it reaches.
    type Fields<'a> = &'a [(&'a str, &'a str)];
    let entries: [(Fields, &[&str]); 6] = [
        (&[("channel", "orders:0")], &["orders:0"]),
        (&[("channel", "orders:0"), ("channels", r#"["orders:1","orders:0"]"#)], &["orders:0", "orders:1"]),
        (&[("channels", r#"["orders:1","orders:2"]"#)], &["orders:1", "orders:2"]),
        (&[("channel", "orders:1")], &["orders:1"]),
        (&[("channel", "orders:2"), ("deliver_at", "1764000000000")], &[]),
        (&[("channels", "[]")], &[]),
    ];
    for (i, (fields, channels)) in entries.iter().enumerate() {
        let tag = format!("e{i}");
        let data = format!("{{\"tag\":\"{tag}\"}}");
        let mut args = vec!["XADD", "app:outbox", "*", "data", &data];
        for (k, v) in *fields {
            args.extend([*k, *v]);
        }
        let id = redis.cli(&args);
        let mut l = ledger.lock().unwrap();
        if channels.is_empty() {
            l.poisoned.insert(tag.clone());
        }
        for channel in *channels {
            l.committed.push(Committed {
                id: order(id.trim()),
                channel: channel.to_string(),
                tag: tag.clone(),
            });
        }
    }
    all_received(&ledger, &got, "s").await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    check(&ledger.lock().unwrap(), &got.lock().unwrap(), "s");
    assert_eq!(pending(&redis), "0", "nothing left pending");
    let dead = redis.cli(&["XRANGE", "app:outbox:dead", "-", "+"]);
    assert!(dead.contains("not_supported") && dead.contains("deliver_at"), "{dead}");
    assert!(dead.contains("bad_channel"), "{dead}");
}
