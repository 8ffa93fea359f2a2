//! Presence shared by several nodes on one Redis: join and leave pushed
//! across nodes; the members of a node that died leave when their leases
//! run out, announced by a surviving node's keeper; a node cut off from
//! Redis long enough to lose its node lease asserts its members again
//! when it is back.

use std::time::{Duration, Instant};

use herald_test_support::{
    create_room, engine_config, join, next_presence, presence_config, CrashableNode, Node, RedisProxy,
    RedisServer, Resp,
};

fn event(kind: &str, user: &str, client: &str) -> (String, String, String) {
    (kind.to_owned(), user.to_owned(), client.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_and_leave_are_pushed_across_nodes() {
    herald_test_support::init_tracing();
    let redis = RedisServer::start();
    let ttl = Duration::from_secs(30);
    let a = Node::on_redis_with(engine_config(&redis.url()), presence_config(ttl)).await;
    let b = Node::on_redis_with(engine_config(&redis.url()), presence_config(ttl)).await;
    create_room(&a, "room:lobby", "host", 60).await;

    let mut watcher = b.connect("watcher").await;
    join(&mut watcher, "room:lobby", "w").await;
    assert_eq!(next_presence(&mut watcher).await, event("join", "watcher", "w"), "its own join");

    let mut alice = a.connect("alice").await;
    join(&mut alice, "room:lobby", "a1").await;
    assert_eq!(next_presence(&mut watcher).await, event("join", "alice", "a1"), "pushed from node A");
    assert_eq!(next_presence(&mut alice).await, event("join", "alice", "a1"));

    let Resp { status, body, .. } = b.get("/api/v1/channels/room:lobby/presence").await;
    assert_eq!((status, body["count"].as_u64()), (200, Some(2)), "{body}");
    let Resp { body, .. } = a.get("/api/v1/channels/room:lobby/presence").await;
    let mut users: Vec<&str> =
        body["members"].as_array().unwrap().iter().map(|m| m["user"].as_str().unwrap()).collect();
    users.sort();
    assert_eq!(users, ["alice", "watcher"], "both nodes list the same members");

    // A clean close leaves at once, long before the 30 s lease would run out.
    let started = Instant::now();
    alice.close(Some(1000), "bye").await.unwrap();
    assert_eq!(next_presence(&mut watcher).await, event("leave", "alice", "a1"));
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(b.get("/api/v1/channels/room:lobby/presence?count=1").await.body["count"], 1);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_of_a_crashed_node_leave_when_their_leases_run_out() {
    herald_test_support::init_tracing();
    let redis = RedisServer::start();
    let ttl = Duration::from_millis(1500);
    let mut a = CrashableNode::on_redis_with(engine_config(&redis.url()), presence_config(ttl)).await;
    let b = Node::on_redis_with(engine_config(&redis.url()), presence_config(ttl)).await;
    create_room(&b, "room:crash", "host", 60).await;
    let mut watcher = b.connect("watcher").await;
    join(&mut watcher, "room:crash", "w").await;
    assert_eq!(next_presence(&mut watcher).await.0, "join");

    let mut alice = a.node().connect("alice").await;
    join(&mut alice, "room:crash", "a1").await;
    let mut bob = a.node().connect("bob").await;
    join(&mut bob, "room:crash", "b1").await;
    assert_eq!(next_presence(&mut watcher).await, event("join", "alice", "a1"));
    assert_eq!(next_presence(&mut watcher).await, event("join", "bob", "b1"));

    // Node A dies: no leave, no renewal; only the leases' expiry tells.
    let crashed = Instant::now();
    a.crash();
    let mut left = vec![next_presence(&mut watcher).await, next_presence(&mut watcher).await];
    let after = crashed.elapsed();
    left.sort();
    assert_eq!(left, [event("leave", "alice", "a1"), event("leave", "bob", "b1")]);
    let heartbeat = ttl / 3;
    assert!(after >= ttl - heartbeat - Duration::from_millis(100), "left by expiry, not at once ({after:?})");
    assert!(after <= ttl + heartbeat + Duration::from_secs(1), "within TTL + one heartbeat ({after:?})");
    assert_eq!(b.get("/api/v1/channels/room:crash/presence?count=1").await.body["count"], 1);
    drop((alice, bob));
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_redis_asserts_its_members_again_when_back() {
    herald_test_support::init_tracing();
    let redis = RedisServer::start();
    let proxy = RedisProxy::start(redis.port).await;
    let ttl = Duration::from_secs(1);
    let mut cut_config = engine_config(&proxy.url());
    cut_config.lease_ttl = Duration::from_secs(1);
    cut_config.command_timeout = Duration::from_millis(500);
    let a = Node::on_redis_with(cut_config, presence_config(ttl)).await;
    let b = Node::on_redis_with(engine_config(&redis.url()), presence_config(ttl)).await;
    create_room(&b, "room:cut", "host", 60).await;
    let mut watcher = b.connect("watcher").await;
    join(&mut watcher, "room:cut", "w").await;
    assert_eq!(next_presence(&mut watcher).await.0, "join");
    let mut alice = a.connect("alice").await;
    join(&mut alice, "room:cut", "a1").await;
    assert_eq!(next_presence(&mut watcher).await, event("join", "alice", "a1"));
    // Alice's client answers pings: her lease is asked back only once she
    // answers one sent after it was found gone.
    let alice = herald_test_support::keep_reading(alice);
    let mut reregistered = a.engine.lease_reregistrations();
    assert_eq!(*reregistered.borrow_and_update(), 0);

    // Node A loses Redis (its WebSockets stay up): its renewals fail, the
    // lease runs out and node B's keeper announces the leave.
    proxy.cut();
    assert_eq!(next_presence(&mut watcher).await, event("leave", "alice", "a1"));
    // Past the node lease's TTL too.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Back: the node lease is found lost and registered again, and alice's
    // next renewal finds her lease gone and joins again.
    proxy.restore();
    tokio::time::timeout(herald_test_support::WAIT, reregistered.changed())
        .await
        .expect("the node lease is registered again in time")
        .unwrap();
    assert_eq!(next_presence(&mut watcher).await, event("join", "alice", "a1"), "asserted again");
    assert_eq!(b.get("/api/v1/channels/room:cut/presence?count=1").await.body["count"], 2);
    assert!(a.engine.stats().lease_reregistrations >= 1);
    alice.abort();
    a.stop().await;
    b.stop().await;
}
