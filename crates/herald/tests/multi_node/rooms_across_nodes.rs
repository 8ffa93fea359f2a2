//! Rooms shared by several nodes on one Redis: a room whose host's node
//! died goes to grace and closes, driven by the surviving node's keeper;
//! compare-and-set writers on two nodes make one chain of versions.

use std::time::{Duration, Instant};

use herald_test_support::{
    create_room, engine_config, join, next_frame, next_room_event, presence_config, CrashableNode, Node,
    RedisServer, Resp,
};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_whose_hosts_node_crashed_closes_after_grace() {
    herald_test_support::init_tracing();
    let redis = RedisServer::start();
    let ttl = Duration::from_secs(1);
    let mut a = CrashableNode::on_redis_with(engine_config(&redis.url()), presence_config(ttl)).await;
    let b = Node::on_redis_with(engine_config(&redis.url()), presence_config(ttl)).await;
    create_room(&b, "room:stage", "host", 1).await;
    let mut watcher = b.connect("watcher").await;
    watcher.subscribe("room:stage", Some((0, ""))).await.unwrap();
    assert_eq!(next_room_event(&mut watcher).await["state"], "open");

    let mut host = a.node().connect("host").await;
    join(&mut host, "room:stage", "h").await;
    let live = next_room_event(&mut watcher).await;
    assert_eq!((live["state"].as_str(), live["reason"].as_str()), (Some("live"), Some("host_joined")));

    // The host's node dies: only node B is left to notice, by the host's
    // lease running out, then the grace period (1 s).
    let crashed = Instant::now();
    a.crash();
    let grace = next_room_event(&mut watcher).await;
    assert_eq!((grace["state"].as_str(), grace["reason"].as_str()), (Some("grace"), Some("host_left")));
    let closed = next_room_event(&mut watcher).await;
    assert_eq!(
        (closed["state"].as_str(), closed["reason"].as_str()),
        (Some("closed"), Some("grace_expired"))
    );
    let took = crashed.elapsed();
    assert!(took >= Duration::from_secs(1), "not before the grace period ({took:?})");
    assert!(took <= ttl + ttl / 3 + Duration::from_secs(1) + Duration::from_secs(2), "{took:?}");
    let unsubscribed = next_frame(&mut watcher).await;
    assert_eq!(
        (unsubscribed.kind.as_str(), unsubscribed.reason.as_deref()),
        ("unsubscribed", Some("room_closed"))
    );

    let Resp { status, body: room, .. } = b.get("/api/v1/rooms/room:stage").await;
    assert_eq!((status, room["state"].as_str(), room["version"].as_u64()), (200, Some("closed"), Some(4)));
    let Resp { status, body, .. } = b.publish("room:stage", json!("late")).await;
    assert_eq!((status, body["code"].as_str()), (410, Some("channel_closed")));
    drop(host);
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_cas_writers_through_two_nodes_make_one_chain_of_versions() {
    herald_test_support::init_tracing();
    const WRITERS: u64 = 50;
    let redis = RedisServer::start();
    let ttl = Duration::from_secs(30);
    let nodes = [
        Node::on_redis_with(engine_config(&redis.url()), presence_config(ttl)).await,
        Node::on_redis_with(engine_config(&redis.url()), presence_config(ttl)).await,
    ];
    create_room(&nodes[0], "room:race", "host", 60).await;
    let path = "/api/v1/rooms/room:race";
    let won = futures_util::future::join_all((0..WRITERS).map(|i| {
        let node = &nodes[(i % 2) as usize];
        async move {
            // Bounded: each round some writer wins, so at most WRITERS
            // rounds lose.
            for _ in 0..4 * WRITERS {
                let Resp { status, body: room, .. } = node.get(path).await;
                assert_eq!(status, 200, "{room}");
                let version = room["version"].as_u64().expect("version");
                let if_match = format!("\"{version}\"");
                let body = json!({ "attributes": { "writer": i } });
                let Resp { status, body: room, .. } =
                    node.call("PATCH", path, Some(body), &[("If-Match", &if_match)]).await;
                match status {
                    200 => {
                        assert_eq!(room["version"].as_u64(), Some(version + 1), "{room}");
                        return version + 1;
                    }
                    412 => continue,
                    other => panic!("writer {i}: {other} {room}"),
                }
            }
            panic!("writer {i} never won");
        }
    }))
    .await;
    let mut versions = won.clone();
    versions.sort_unstable();
    assert_eq!(versions, (2..=WRITERS + 1).collect::<Vec<_>>(), "each version written once");

    // The log holds one event per version, in version order, and both
    // nodes see the last one.
    let events: Vec<u64> = nodes[1]
        .history("room:race")
        .await
        .iter()
        .filter(|m| m["type"] == "room")
        .map(|m| m["data"]["version"].as_u64().expect("version"))
        .collect();
    assert_eq!(events, (1..=WRITERS + 1).collect::<Vec<_>>());
    for node in &nodes {
        assert_eq!(node.get(path).await.body["version"].as_u64(), Some(WRITERS + 1));
    }
    for node in nodes {
        node.stop().await;
    }
}
