//! The backend's actions across two nodes on one Redis: a call to one node
//! reaches the user's connections on both, on both protocols; a ban and a
//! revocation stored in Redis hold on the other node at once; the
//! connection, channel and node lists gather every node, and a node that
//! died leaves the node list within its lease.

use std::time::{Duration, Instant};

use herald_client::{ClientError, ConnectOptions, Connection};
use herald_test_support::{
    engine_config, hs256_token, now_secs, read_until_closed, CrashableNode, Node, RedisServer, TestServer,
    WAIT,
};
use serde_json::json;

use crate::centrifugo::Cf;

async fn ws<E: herald_core::Engine + 'static>(srv: &TestServer<E>, user: &str, device: &str) -> Connection {
    Connection::connect(&ConnectOptions::dev_user(&srv.url, user).with_device(device)).await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_connections_on_two_nodes_close_at_once_and_a_ban_holds_on_the_other_node() {
    herald_test_support::init_tracing();
    let redis = RedisServer::start();
    let a = Node::on_redis(&redis.url()).await;
    let b = Node::on_redis(&redis.url()).await;
    let mut on_a = ws(&a, "eve", "phone").await;
    let mut on_b = ws(&b, "eve", "laptop").await;
    let (mut cf_b, r) = Cf::connect(b.addr, "eve", "tablet").await;
    assert!(r["connect"]["client"].is_string(), "{r}");

    let listed = a.get("/api/v1/users/eve/connections").await.body;
    let nodes: std::collections::BTreeSet<&str> =
        listed["connections"].as_array().unwrap().iter().map(|c| c["node"].as_str().unwrap()).collect();
    assert_eq!((listed["connections"].as_array().unwrap().len(), nodes.len()), (3, 2), "{listed}");

    let called = Instant::now();
    let r = a
        .call(
            "POST",
            "/api/v1/users/eve/disconnect",
            Some(json!({"reconnect": false, "ban_seconds": 60})),
            &[],
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    let (t1, t2, t3) = tokio::join!(
        async { (read_until_closed(&mut on_a).await.1, called.elapsed()) },
        async { (read_until_closed(&mut on_b).await.1, called.elapsed()) },
        async { (cf_b.closed().await, called.elapsed()) },
    );
    assert_eq!((t1.0, t2.0, t3.0), (Some(4012), Some(4012), Some(3503)));
    let last = t1.1.max(t2.1).max(t3.1);
    println!("disconnect across two nodes: last of 3 connections closed {last:?} after the call");
    assert!(last < Duration::from_secs(2), "{last:?}");

    // An immediate reconnect to the other node is refused before the upgrade.
    match Connection::connect(&ConnectOptions::dev_user(&b.url, "eve").with_device("phone")).await {
        Err(ClientError::Rejected { status: 403, code: Some(code), .. }) => assert_eq!(code, "banned"),
        other => panic!("expected 403 banned on the other node, got {other:?}"),
    }
    let (mut cf, _) = Cf::connect(a.addr, "eve", "x").await;
    assert_eq!(cf.closed().await, Some(3503));
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_on_one_node_closes_old_tokens_on_the_other_and_admits_fresh_ones() {
    let redis = RedisServer::start();
    let a = Node::on_redis(&redis.url()).await;
    let b = Node::on_redis(&redis.url()).await;
    let token = |iat: u64| {
        hs256_token(&json!({"sub": "ron", "channels": ["chat:*"], "exp": now_secs() + 600, "iat": iat}))
    };
    let old = token(now_secs() - 60);
    let mut on_b = Connection::connect(&ConnectOptions::token(&b.url, &old)).await.unwrap();
    let before = (now_secs() - 5) * 1000;
    let r = a.call("POST", "/api/v1/users/ron/revoke", Some(json!({"issued_before_ms": before})), &[]).await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(read_until_closed(&mut on_b).await.1, Some(4003), "closed as expired on the other node");
    assert!(
        Connection::connect(&ConnectOptions::token(&b.url, &old)).await.is_err(),
        "the old token refused"
    );
    let fresh = token(now_secs());
    Connection::connect(&ConnectOptions::token(&b.url, &fresh))
        .await
        .expect("a fresh token")
        .ping()
        .await
        .unwrap();
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_side_subscribe_reaches_connections_on_both_nodes() {
    let redis = RedisServer::start();
    let a = Node::on_redis(&redis.url()).await;
    let b = Node::on_redis(&redis.url()).await;
    for n in 1..=2 {
        a.publish("chat:x", json!(n)).await;
    }
    let mut on_a = ws(&a, "sam", "1").await;
    let mut on_b = ws(&b, "sam", "2").await;
    let (mut cf_b, _) = Cf::connect(b.addr, "sam", "3").await;
    let r = b
        .call(
            "POST",
            "/api/v1/users/sam/subscriptions",
            Some(json!({"channel": "chat:x", "since": {"seq": 1}})),
            &[],
        )
        .await;
    assert_eq!(r.status, 202);
    for c in [&mut on_a, &mut on_b] {
        let s = next_kind(c, "subscribed").await;
        assert_eq!(s.channel.as_deref(), Some("chat:x"));
        assert_eq!(herald_test_support::seqs(&herald_test_support::next_messages(c, 1).await), [2]);
    }
    let p = cf_b.push().await;
    assert_eq!((p["channel"].as_str(), p["subscribe"]["offset"].as_u64()), (Some("chat:x"), Some(1)), "{p}");
    assert_eq!(cf_b.push().await["pub"]["offset"], 2);
    a.publish("chat:x", json!(3)).await;
    assert_eq!(cf_b.push().await["pub"]["offset"], 3);
    for c in [&mut on_a, &mut on_b] {
        assert_eq!(herald_test_support::seqs(&herald_test_support::next_messages(c, 1).await), [3]);
    }
    let channels = b.get("/api/v1/channels?pattern=chat:*").await.body;
    assert_eq!(channels["channels"], json!([{"channel": "chat:x", "subscribers": 3}]), "{channels}");
    a.call("DELETE", "/api/v1/users/sam/subscriptions/chat:x", None, &[]).await;
    for c in [&mut on_a, &mut on_b] {
        next_kind(c, "unsubscribed").await;
    }
    assert_eq!(cf_b.push().await["unsubscribe"]["code"], 2000);
    a.stop().await;
    b.stop().await;
}

async fn next_kind(c: &mut Connection, kind: &str) -> herald_proto::MessageView {
    loop {
        let f = herald_test_support::next_frame(c).await;
        if f.kind == kind {
            return f;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_and_node_lists_gather_every_node_and_drop_a_dead_one() {
    let redis = RedisServer::start();
    let a = Node::on_redis(&redis.url()).await;
    let mut b = CrashableNode::on_redis_with(engine_config(&redis.url()), |_| {}).await;
    let mut on_a = ws(&a, "lu", "1").await;
    on_a.subscribe("chat:l", None).await.unwrap();
    let mut on_b = ws(b.node(), "lu", "2").await;
    on_b.subscribe("chat:l", None).await.unwrap();
    on_b.subscribe("chat:m", None).await.unwrap();

    herald_test_support::assert_eventually("both nodes listed", || async {
        a.get("/api/v1/nodes").await.body["nodes"].as_array().is_some_and(|n| n.len() == 2)
    })
    .await;
    let channels = a.get("/api/v1/channels").await.body;
    assert_eq!(
        channels["channels"],
        json!([{"channel": "chat:l", "subscribers": 2}, {"channel": "chat:m", "subscribers": 1}]),
        "{channels}"
    );
    let conns = a.get("/api/v1/users/lu/connections").await.body;
    assert_eq!(conns["connections"].as_array().unwrap().len(), 2, "{conns}");

    b.crash();
    let crashed = Instant::now();
    // Lists answer within their wait, naming the node that did not answer
    // while it is still registered, and without it afterwards.
    let channels = a.get("/api/v1/channels").await.body;
    assert_eq!(channels["channels"], json!([{"channel": "chat:l", "subscribers": 1}]), "{channels}");
    herald_test_support::assert_eventually("the dead node leaves the list", || async {
        a.get("/api/v1/nodes").await.body["nodes"].as_array().is_some_and(|n| n.len() == 1)
    })
    .await;
    let gone = crashed.elapsed();
    println!("a crashed node left the node list {gone:?} after it died");
    assert!(gone <= Duration::from_secs(6) + WAIT, "{gone:?}");
    let started = Instant::now();
    let channels = a.get("/api/v1/channels").await.body;
    assert!(channels.get("nodes_missing").is_none(), "{channels}");
    assert!(started.elapsed() < Duration::from_secs(1), "no wait for a node no longer listed");
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_removed_through_one_node_leaves_the_room_on_the_other() {
    use herald_test_support::{create_room, join, next_presence, presence_config};
    let redis = RedisServer::start();
    let ttl = Duration::from_secs(30);
    let a = Node::on_redis_with(engine_config(&redis.url()), presence_config(ttl)).await;
    let b = Node::on_redis_with(engine_config(&redis.url()), presence_config(ttl)).await;
    create_room(&a, "room:rm", "host", 60).await;
    let mut watcher = a.connect("watcher").await;
    join(&mut watcher, "room:rm", "w").await;
    assert_eq!(next_presence(&mut watcher).await.0, "join");
    let mut speaker = b.connect("speaker").await;
    join(&mut speaker, "room:rm", "s").await;
    assert_eq!(next_presence(&mut watcher).await.1, "speaker");
    speaker.publish("room:rm", &json!("talking"), None).await.unwrap();

    let removed = Instant::now();
    let r = a.call("DELETE", "/api/v1/rooms/room:rm/members/speaker", None, &[]).await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(next_kind(&mut speaker, "unsubscribed").await.channel.as_deref(), Some("room:rm"));
    let (kind, user, _) = loop {
        let p = next_presence(&mut watcher).await;
        if p.0 == "leave" {
            break p;
        }
    };
    assert_eq!((kind.as_str(), user.as_str()), ("leave", "speaker"));
    assert!(
        removed.elapsed() < Duration::from_secs(2),
        "left at once, not at the lease's end: {:?}",
        removed.elapsed()
    );
    let members = b.get("/api/v1/channels/room:rm/presence").await.body;
    let users: Vec<&str> =
        members["members"].as_array().unwrap().iter().map(|m| m["user"].as_str().unwrap()).collect();
    assert_eq!(users, ["watcher"], "{members}");
    let r = speaker.subscribe("room:rm", None).await.unwrap();
    assert_eq!(r.kind, "error", "rejoin refused on the other node: {r:?}");
    a.stop().await;
    b.stop().await;
}
