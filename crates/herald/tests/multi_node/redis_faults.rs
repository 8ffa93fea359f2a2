//! Redis misbehaving under a running node: paused (SIGSTOP), killed and
//! restarted from its AOF, restarted empty, its pub/sub connections
//! killed. Publishes fail fast with 503 (never a 2xx that was not stored),
//! sockets stay up, everything recovers by itself, and subscribers get
//! every acknowledged message in order or are told to resync.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_client::ServerEvent;
use herald_test_support::{data, eventually, next_event, next_message, Node, RedisServer, Resp, WAIT};
use serde_json::{json, Value};
use tokio::sync::Mutex;

/// Publishers hammering one channel until `stop`: `(status, data, elapsed)`
/// of every publish.
struct Load {
    results: Arc<Mutex<Vec<(u16, Value, Duration)>>>,
    stop: tokio_util::sync::CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(node: &Node, channel: &str, publishers: usize) -> Self {
        let results = Arc::new(Mutex::new(Vec::new()));
        let stop = tokio_util::sync::CancellationToken::new();
        let mut tasks = Vec::new();
        for p in 0..publishers {
            let (url, channel, results, stop) =
                (node.url.clone(), channel.to_owned(), results.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let http = reqwest::Client::new();
                // Bounded: at most this many publishes per publisher, paced
                // (the log must stay under the namespace's history_size).
                for i in 0..2_000u64 {
                    if stop.is_cancelled() {
                        return;
                    }
                    let d = json!({ "p": p, "i": i });
                    let started = Instant::now();
                    let r = http
                        .post(format!("{url}/api/v1/channels/{channel}/messages"))
                        .bearer_auth(herald_test_support::API_KEY)
                        .timeout(WAIT)
                        .json(&json!({ "data": d }))
                        .send()
                        .await;
                    let status = r.map(|r| r.status().as_u16()).unwrap_or(0);
                    results.lock().await.push((status, d, started.elapsed()));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }));
        }
        Load { results, stop, tasks }
    }

    async fn finish(self) -> Vec<(u16, Value, Duration)> {
        self.stop.cancel();
        for t in self.tasks {
            t.await.unwrap();
        }
        Arc::try_unwrap(self.results).unwrap().into_inner()
    }
}

/// Every acknowledged publish is in the log exactly once, the log is
/// gap-free, and the subscriber `c` got the whole log in order.
async fn assert_nothing_acked_lost(
    node: &Node,
    channel: &str,
    results: &[(u16, Value, Duration)],
    c: &mut herald_client::Connection,
) {
    let history = node.history(channel).await;
    for (i, m) in history.iter().enumerate() {
        assert_eq!(m["seq"].as_u64(), Some(i as u64 + 1), "gap-free log from 1");
    }
    let mut stored = BTreeMap::new();
    for m in &history {
        assert!(stored.insert(m["data"].to_string(), m["seq"].clone()).is_none(), "stored once: {m}");
    }
    let acked: Vec<&Value> = results.iter().filter(|r| r.0 == 201).map(|r| &r.1).collect();
    assert!(!acked.is_empty());
    for d in &acked {
        assert!(stored.contains_key(&d.to_string()), "acknowledged {d} is in the log");
    }
    for (seq, m) in history.iter().enumerate() {
        let got = next_message(c).await;
        assert_eq!(got.seq, Some(seq as u64 + 1), "in order, no gap");
        assert_eq!(data(&got), m["data"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_redis_fails_publishes_fast_and_everything_recovers() {
    herald_test_support::init_tracing();
    let redis = RedisServer::start();
    let mut config = herald_test_support::engine_config(&redis.url());
    config.command_timeout = Duration::from_millis(500);
    let node = Node::on_redis_with(config, |_| {}).await;
    let mut c = node.connect("watcher").await;
    c.subscribe("chat:pause", None).await.unwrap();
    let load = Load::start(&node, "chat:pause", 4);
    tokio::time::sleep(Duration::from_millis(500)).await;

    redis.sigstop();
    let Resp { status, .. } = eventually("readyz to fail", || async {
        let r = node.get("/readyz").await;
        (r.status == 503).then_some(r)
    })
    .await;
    assert_eq!(status, 503);
    // Paused for about 10 s in all, publishing all along.
    tokio::time::sleep(Duration::from_secs(9)).await;
    // The socket stays up and answers while Redis is paused.
    assert_eq!(c.ping().await.unwrap().kind, "pong");
    redis.sigcont();

    eventually("readyz to pass", || async { (node.get("/readyz").await.status == 200).then_some(()) }).await;
    let before = node.history("chat:pause").await.len();
    eventually("publishes to succeed again", || async {
        (node.history("chat:pause").await.len() > before + 20).then_some(())
    })
    .await;
    let results = load.finish().await;

    let failed: Vec<_> = results.iter().filter(|r| r.0 != 201).collect();
    assert!(!failed.is_empty(), "some publishes ran into the pause");
    for (status, _, elapsed) in &failed {
        assert_eq!(*status, 503, "a paused Redis is a 503, nothing else");
        assert!(*elapsed < Duration::from_millis(2500), "503 soon after the command timeout: {elapsed:?}");
    }
    assert_nothing_acked_lost(&node, "chat:pause", &results, &mut c).await;
    drop(redis);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_from_its_aof_loses_nothing_acknowledged() {
    herald_test_support::init_tracing();
    let mut redis = RedisServer::start();
    let node = Node::on_redis(&redis.url()).await;
    let mut c = node.connect("watcher").await;
    let ok = c.subscribe("chat:crash", None).await.unwrap();
    let epoch = ok.epoch.clone().unwrap();
    let load = Load::start(&node, "chat:crash", 4);
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.kill9();
    // Longer than one reconnect round of the connections (they give up
    // after a few attempts; the probe and the pub/sub PING start another).
    tokio::time::sleep(Duration::from_secs(4)).await;
    redis.restart();
    let before = node.history("chat:crash").await.len();
    eventually("publishes to succeed again", || async {
        (node.history("chat:crash").await.len() > before + 20).then_some(())
    })
    .await;
    let results = load.finish().await;
    assert!(results.iter().all(|r| r.0 == 201 || r.0 == 503), "only 201 and 503");
    // The AOF kept the channel's meta: same epoch, no resync.
    let Resp { body, .. } = node.get("/api/v1/channels/chat:crash/messages?after=0&limit=1").await;
    assert_eq!(body["epoch"].as_str(), Some(epoch.as_str()));
    assert_nothing_acked_lost(&node, "chat:crash", &results, &mut c).await;
    assert_eq!(node.engine.stats().data_loss_detected, 0);
    // Pub/sub itself is back (not only the head checks' fills).
    let before = node.engine.stats().fanout_delivered;
    for i in 0..5 {
        assert_eq!(node.publish("chat:crash", json!({ "after": i })).await.status, 201);
        assert_eq!(data(&next_message(&mut c).await), json!({ "after": i }));
    }
    assert!(node.engine.stats().fanout_delivered >= before + 4, "live over pub/sub again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_empty_starts_a_new_epoch_and_clients_resync() {
    herald_test_support::init_tracing();
    let mut redis = RedisServer::start();
    let (a, b) = (Node::on_redis(&redis.url()).await, Node::on_redis(&redis.url()).await);
    let mut c = a.connect("watcher").await;
    let ok = c.subscribe("chat:empty", None).await.unwrap();
    let old_epoch = ok.epoch.clone().unwrap();
    for i in 1..=5 {
        assert_eq!(b.publish("chat:empty", json!(i)).await.status, 201);
    }
    for seq in 1..=5 {
        assert_eq!(next_message(&mut c).await.seq, Some(seq));
    }

    redis.restart_empty();
    let receipt = eventually("a publish after the restart", || async {
        let Resp { status, body, .. } = b.publish("chat:empty", json!("after")).await;
        (status == 201).then_some(body)
    })
    .await;
    assert_eq!(receipt["seq"], 1, "the log starts again");
    let new_epoch = receipt["epoch"].as_str().unwrap().to_owned();
    assert_ne!(new_epoch, old_epoch);

    // The subscriber is not left waiting for seq 6: it is told to resync.
    match next_event(&mut c).await {
        Some(ServerEvent::Closed { code, .. }) => assert_eq!(code, Some(herald_proto::close::RESYNC)),
        Some(ServerEvent::Frame(f)) if f.kind == "disconnect" => {}
        other => panic!("expected a resync, got {other:?}"),
    }
    let mut c = a.connect("watcher").await;
    let ok = c.subscribe("chat:empty", Some((5, &old_epoch))).await.unwrap();
    assert_eq!((ok.epoch_changed, ok.epoch.as_deref()), (Some(true), Some(new_epoch.as_str())));
    let m = next_message(&mut c).await;
    assert_eq!((m.seq, data(&m)), (Some(1), json!("after")));
    let stats = a.engine.stats();
    assert!(stats.epoch_changes >= 1 && stats.data_loss_detected >= 1, "{stats:?}");
    // Counted where operators look.
    let m = reqwest::get(format!("{}/metrics", a.url)).await.unwrap().text().await.unwrap();
    let loss =
        m.lines().find(|l| l.starts_with("herald_engine_data_loss_detected_total ")).expect("exported");
    assert_ne!(loss, "herald_engine_data_loss_detected_total 0", "{m}");
}

/// A channel with no publish after Redis lost its data: its subscribers on
/// both nodes are told to resync as soon as a node sees the loss (the
/// head check of a quiet channel), not with the next message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_channel_hears_of_lost_data_without_a_publish() {
    herald_test_support::init_tracing();
    let mut redis = RedisServer::start();
    let (a, b) = (Node::on_redis(&redis.url()).await, Node::on_redis(&redis.url()).await);
    let mut on_a = a.connect("watcher").await;
    let mut on_b = b.connect("watcher").await;
    on_a.subscribe("chat:quiet", None).await.unwrap();
    on_b.subscribe("chat:quiet", None).await.unwrap();
    for i in 1..=3 {
        assert_eq!(b.publish("chat:quiet", json!(i)).await.status, 201);
    }
    for c in [&mut on_a, &mut on_b] {
        for seq in 1..=3 {
            assert_eq!(next_message(c).await.seq, Some(seq));
        }
    }

    redis.restart_empty();
    let restarted = Instant::now();
    // Nothing is published from here on.
    for c in [&mut on_a, &mut on_b] {
        loop {
            match next_event(c).await {
                Some(ServerEvent::Closed { code, .. }) => {
                    assert_eq!(code, Some(herald_proto::close::RESYNC));
                    break;
                }
                Some(ServerEvent::Frame(f)) if f.kind == "disconnect" || f.kind == "pong" => {}
                other => panic!("expected a resync, got {other:?}"),
            }
        }
    }
    let told = restarted.elapsed();
    eprintln!("quiet channel: subscribers on both nodes told to resync {told:?} after the restart");
    assert!(told < Duration::from_secs(10), "told within the head check and reconnect times ({told:?})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_pubsub_connections_lose_no_message() {
    herald_test_support::init_tracing();
    const N: u64 = 300;
    let redis = RedisServer::start();
    let (a, b) = (Node::on_redis(&redis.url()).await, Node::on_redis(&redis.url()).await);
    let mut c = b.connect("watcher").await;
    c.subscribe("chat:kill", None).await.unwrap();
    let publisher = {
        let url = a.url.clone();
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            for i in 1..=N {
                let r = http
                    .post(format!("{url}/api/v1/channels/chat:kill/messages"))
                    .bearer_auth(herald_test_support::API_KEY)
                    .json(&json!({ "data": i }))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 201);
            }
        })
    };
    let mut seen = HashSet::new();
    for seq in 1..=N {
        if seq == 50 || seq == 150 {
            let killed = redis.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]);
            assert!(killed.trim().parse::<u64>().unwrap_or(0) >= 1, "killed: {killed}");
        }
        let m = next_message(&mut c).await;
        assert_eq!(m.seq, Some(seq), "in order, no gap");
        assert!(seen.insert(seq));
    }
    publisher.await.unwrap();
    assert!(b.engine.stats().pubsub_disconnects >= 1);
}
