//! Several Herald nodes on one Redis: what is published through one node
//! reaches subscribers on every node, in seq order, without gap or
//! duplicate, also with publishers on several nodes at once.

use std::collections::{HashMap, HashSet};

use herald_test_support::{data, next_message, Node, RedisServer, Resp, API_KEY};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_publishers_on_two_nodes_reach_subscribers_on_three_in_one_order() {
    herald_test_support::init_tracing();
    const PER_PUBLISHER: u64 = 100;
    let redis = RedisServer::start();
    let nodes = [
        Node::on_redis(&redis.url()).await,
        Node::on_redis(&redis.url()).await,
        Node::on_redis(&redis.url()).await,
    ];
    let mut subs = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let mut c = node.connect(&format!("u{i}")).await;
        let ok = c.subscribe("chat:x", None).await.unwrap();
        assert_eq!((ok.kind.as_str(), ok.head), ("ok", Some(0)));
        subs.push(c);
    }
    // Two publishers per node on nodes 0 and 1, all at once.
    let mut tasks = Vec::new();
    for (p, node) in [&nodes[0], &nodes[0], &nodes[1], &nodes[1]].into_iter().enumerate() {
        let (url, http) = (node.url.clone(), reqwest::Client::new());
        tasks.push(tokio::spawn(async move {
            for i in 0..PER_PUBLISHER {
                let r = http
                    .post(format!("{url}/api/v1/channels/chat:x/messages"))
                    .bearer_auth(herald_test_support::API_KEY)
                    .json(&json!({ "data": { "p": p, "i": i } }))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 201);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let total = 4 * PER_PUBLISHER;
    let history = nodes[2].history("chat:x").await;
    assert_eq!(history.len() as u64, total);
    let mut per_subscriber = Vec::new();
    for c in &mut subs {
        let mut got = Vec::new();
        for seq in 1..=total {
            let m = next_message(c).await;
            assert_eq!(m.seq, Some(seq), "in order, no gap, no duplicate");
            got.push(data(&m));
        }
        per_subscriber.push(got);
    }
    // Every node delivered the log's order, and each publisher's own
    // messages in the order it sent them.
    let log: Vec<_> = history.iter().map(|m| m["data"].clone()).collect();
    for got in &per_subscriber {
        assert_eq!(got, &log);
    }
    for p in 0..4 {
        let mine: Vec<u64> = log.iter().filter(|d| d["p"] == p).map(|d| d["i"].as_u64().unwrap()).collect();
        assert_eq!(mine, (0..PER_PUBLISHER).collect::<Vec<_>>());
    }
    for n in nodes {
        n.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_idempotency_key_through_two_nodes_at_once_appends_once() {
    herald_test_support::init_tracing();
    let redis = RedisServer::start();
    let (a, b) = (Node::on_redis(&redis.url()).await, Node::on_redis(&redis.url()).await);
    let mut watcher = b.connect("w").await;
    watcher.subscribe("chat:idem", None).await.unwrap();
    for round in 0..10 {
        let key = format!("order-{round}");
        let body = json!({ "round": round });
        let body = json!({ "data": body });
        let (ra, rb) = tokio::join!(
            a.publish_with("chat:idem", body.clone(), Some(&key), Some(API_KEY)),
            b.publish_with("chat:idem", body, Some(&key), Some(API_KEY))
        );
        assert_eq!((ra.status, rb.status), (201, 201), "{ra:?} {rb:?}");
        assert_eq!(
            (&ra.body["seq"], &ra.body["id"]),
            (&rb.body["seq"], &rb.body["id"]),
            "one message, one receipt"
        );
        let m = next_message(&mut watcher).await;
        assert_eq!(m.seq, Some(round + 1));
    }
    assert_eq!(a.history("chat:idem").await.len(), 10, "each key appended once");
    // The same key on another channel is another request: refused on both.
    let body = json!({ "data": { "round": 0 } });
    let Resp { status, body, .. } = b.publish_with("chat:other", body, Some("order-0"), Some(API_KEY)).await;
    assert_eq!((status, body["code"].as_str()), (422, Some("idempotency_key_reused")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_resumes_on_another_node_after_its_node_is_gone() {
    herald_test_support::init_tracing();
    let redis = RedisServer::start();
    let (a, b) = (Node::on_redis(&redis.url()).await, Node::on_redis(&redis.url()).await);
    let mut c = a.connect("roamer").await;
    let ok = c.subscribe("chat:roam", None).await.unwrap();
    let epoch = ok.epoch.clone().unwrap();
    for i in 1..=5 {
        assert_eq!(b.publish("chat:roam", json!(i)).await.status, 201);
    }
    let mut last = 0;
    for _ in 0..5 {
        last = next_message(&mut c).await.seq.unwrap();
    }
    assert_eq!(last, 5);
    // Node A dies; meanwhile more is published through B.
    a.kill();
    for i in 6..=12 {
        assert_eq!(b.publish("chat:roam", json!(i)).await.status, 201);
    }
    let mut c = b.connect("roamer").await;
    let ok = c.subscribe("chat:roam", Some((last, &epoch))).await.unwrap();
    assert_eq!((ok.head, ok.truncated, ok.epoch_changed), (Some(12), Some(false), None));
    let mut seen = HashSet::new();
    for seq in 6..=12 {
        let m = next_message(&mut c).await;
        assert_eq!(m.seq, Some(seq));
        assert!(seen.insert(seq));
    }
    // And live from there, published through B itself.
    assert_eq!(b.publish("chat:roam", json!(13)).await.status, 201);
    assert_eq!(next_message(&mut c).await.seq, Some(13));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_a_cluster_deliver_every_channel_in_order() {
    herald_test_support::init_tracing();
    const PER_NODE: u64 = 30;
    let cluster = herald_test_support::RedisCluster::start();
    let (a, b) = (Node::on_redis(&cluster.url()).await, Node::on_redis(&cluster.url()).await);
    // Channels spread over the cluster's slots (and so its three masters).
    let channels: Vec<String> = (0..6).map(|i| format!("chat:c{i}")).collect();
    let mut subs = Vec::new();
    for (i, node) in [&a, &b].into_iter().enumerate() {
        let mut c = node.connect(&format!("s{i}")).await;
        for ch in &channels {
            c.subscribe(ch, None).await.unwrap();
        }
        subs.push(c);
    }
    let mut tasks = Vec::new();
    for node in [&a, &b] {
        for ch in channels.clone() {
            let (url, http) = (node.url.clone(), reqwest::Client::new());
            tasks.push(tokio::spawn(async move {
                for i in 0..PER_NODE {
                    let r = http
                        .post(format!("{url}/api/v1/channels/{ch}/messages"))
                        .bearer_auth(herald_test_support::API_KEY)
                        .json(&json!({ "data": i }))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), 201);
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let total = 2 * PER_NODE * channels.len() as u64;
    for c in &mut subs {
        let mut next: HashMap<String, u64> = HashMap::new();
        for _ in 0..total {
            let m = next_message(c).await;
            let seq = next.entry(m.channel.clone().unwrap()).or_insert(1);
            assert_eq!(m.seq, Some(*seq), "per channel in order, no gap");
            *seq += 1;
        }
        assert!(next.values().all(|&n| n == 2 * PER_NODE + 1));
    }
}
