//! The fan-out repairs what pub/sub cannot see: a message that never came
//! over pub/sub is delivered by the periodic head check, and a log that
//! lost its tail under the same epoch gets a new epoch. Also the node's
//! lease comes back after it was lost.

use std::sync::Arc;
use std::time::Duration;

use herald_core::conformance::{eventually, request, RecordingSink, WAIT};
use herald_core::{Lifecycle, Log};
use herald_proto::ChannelName;
use herald_redis::testing::{self, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_missing_from_pubsub_is_delivered_by_the_head_check() {
    testing::init_tracing();
    let redis = RedisServer::start();
    let engine = testing::engine(&redis.url()).await;
    let sink = Arc::new(RecordingSink::default());
    engine.set_sink(sink.clone());
    let ch = ChannelName::new("chat:quiet").unwrap();
    engine.watch(&ch).await.unwrap();
    engine.append(request(&ch, "1")).await.unwrap();
    sink.wait_for(&ch, 1).await;

    // Another writer appends seq 2 without publishing it (as if its
    // pub/sub message was lost), and nothing follows it.
    let frame = r#"{"type":"message","channel":"chat:quiet","seq":2,"id":"x-2","ts":2,"data":2}"#;
    let log = "herald:{chat:quiet}:log";
    redis.cli(&["XADD", log, "2-0", "t", "2", "i", "x-2", "f", frame]);
    redis.cli(&["HSET", "herald:{chat:quiet}:meta", "seq", "2"]);

    let got = sink.wait_for(&ch, 2).await;
    assert_eq!(got.iter().map(|m| m.seq).collect::<Vec<_>>(), vec![Some(1), Some(2)]);
    assert_eq!(&got[1].frame[..], frame.as_bytes(), "the stored frame, as stored");
    assert!(engine.stats().fanout_filled >= 1);
    engine.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_that_lost_its_tail_gets_a_new_epoch() {
    testing::init_tracing();
    let redis = RedisServer::start();
    let engine = testing::engine(&redis.url()).await;
    let sink = Arc::new(RecordingSink::default());
    engine.set_sink(sink.clone());
    let ch = ChannelName::new("chat:tail").unwrap();
    engine.watch(&ch).await.unwrap();
    let mut epoch = None;
    for i in 1..=5 {
        epoch = Some(engine.append(request(&ch, &i.to_string())).await.unwrap().epoch);
    }
    let old = epoch.unwrap();
    sink.wait_for(&ch, 5).await;

    // What a failover to a replica that missed the last two appends looks
    // like: the same epoch, the head back at 3.
    redis.cli(&["XDEL", "herald:{chat:tail}:log", "4-0", "5-0"]);
    redis.cli(&["XSETID", "herald:{chat:tail}:log", "3-0"]);
    redis.cli(&["HSET", "herald:{chat:tail}:meta", "seq", "3"]);

    let pos = eventually("a new epoch", || async {
        let pos = engine.position(&ch).await.unwrap();
        (pos.epoch != old).then_some(pos)
    })
    .await;
    assert_eq!(pos.head, 3, "the log goes on from what survived");
    // The sink hears of the new epoch at once, by a marker (sessions on the
    // old one resync), then gets the head message of the new epoch.
    let got = eventually("the head message of the new epoch", || async {
        let new: Vec<_> = sink.delivered_on(&ch).into_iter().filter(|m| m.epoch == pos.epoch).collect();
        (new.len() >= 2).then_some(new)
    })
    .await;
    assert!(got[0].is_epoch_marker() && got[0].frame.is_empty(), "{:?}", got[0]);
    assert_eq!(got[1].seq, Some(3));
    let next = engine.append(request(&ch, "6")).await.unwrap();
    assert_eq!((next.seq, &next.epoch), (Some(4), &pos.epoch));
    assert_eq!(engine.stats().data_loss_detected, 1);
    engine.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_is_registered_again_and_released_on_close() {
    testing::init_tracing();
    let redis = RedisServer::start();
    let mut config = testing::engine_config(&redis.url());
    config.node_id = Some("node-a".into());
    config.lease_ttl = Duration::from_millis(600);
    let engine = herald_redis::RedisEngine::open(config).await.unwrap();
    let key = "herald:node:{node-a}";
    eventually("the lease", || async { (redis.cli(&["EXISTS", key]).trim() == "1").then_some(()) }).await;
    let mut events = engine.lease_reregistrations();
    assert_eq!(*events.borrow_and_update(), 0);

    redis.cli(&["DEL", key]);
    tokio::time::timeout(WAIT, events.changed()).await.expect("re-registered in time").unwrap();
    assert_eq!(*events.borrow(), 1);
    assert_eq!(redis.cli(&["EXISTS", key]).trim(), "1");
    let ttl: i64 = redis.cli(&["PTTL", key]).trim().parse().unwrap();
    assert!(ttl > 0 && ttl <= 600, "the lease has its TTL: {ttl}");

    // Someone else's value (a second process with this id) is taken over.
    redis.cli(&["SET", key, "impostor"]);
    tokio::time::timeout(WAIT, events.changed()).await.expect("taken over in time").unwrap();
    assert_eq!(engine.stats().lease_reregistrations, 2);

    engine.close().await;
    assert_eq!(redis.cli(&["EXISTS", key]).trim(), "0", "a clean close releases the lease");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_are_counted_so_a_late_unwatch_keeps_a_new_watch() {
    testing::init_tracing();
    let redis = RedisServer::start();
    let engine = testing::engine(&redis.url()).await;
    let sink = Arc::new(RecordingSink::default());
    engine.set_sink(sink.clone());
    let ch = ChannelName::new("chat:count").unwrap();
    // The server's order when a subscriber leaves and another arrives: the
    // second watch runs before the (spawned) unwatch of the first.
    engine.watch(&ch).await.unwrap();
    engine.watch(&ch).await.unwrap();
    engine.unwatch(&ch).await;
    assert_eq!(engine.watched_channels(), 1);
    engine.append(request(&ch, "1")).await.unwrap();
    sink.wait_for(&ch, 1).await;
    engine.unwatch(&ch).await;
    assert_eq!(engine.watched_channels(), 0);
    eventually("the pub/sub unsubscribe", || async {
        let n = redis.cli(&["PUBSUB", "NUMSUB", "herald:{chat:count}:fan"]);
        (n.lines().nth(1).map(str::trim) == Some("0")).then_some(())
    })
    .await;
    engine.append(request(&ch, "2")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sink.delivered_on(&ch).len(), 1, "nothing after the last unwatch");
    engine.close().await;
}
