//! The append path's shape on Redis: a batch of many channels (several
//! channels to a script run, and more channels than one run holds) is
//! answered message by message as separate appends would be, and messages
//! older than the retention age leave the log, also after the length limit
//! or a lost stream moved the log's first entry.

use std::sync::Arc;
use std::time::Duration;

use herald_core::conformance::{request, RecordingSink};
use herald_core::{Dedup, Lifecycle, Log, Retention};
use herald_proto::ChannelName;
use herald_redis::testing::{self, RedisServer};

fn aged(ch: &ChannelName, data: &str, max_len: u64, max_age: Duration) -> herald_core::AppendRequest {
    let mut r = request(ch, data);
    r.retention = Retention { max_len, max_age: Some(max_age) };
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_many_channels_is_answered_as_separate_appends() {
    testing::init_tracing();
    let redis = RedisServer::start();
    let engine = testing::engine(&redis.url()).await;
    let sink = Arc::new(RecordingSink::default());
    engine.set_sink(sink.clone());
    // 400 channels, one message each, then a channel with 300 messages
    // (a run of its own), then a key used twice, then a key of another
    // channel: more than one run of several channels.
    let channels: Vec<ChannelName> =
        (0..400).map(|i| ChannelName::new(&format!("chat:r{i}")).unwrap()).collect();
    let big = ChannelName::new("chat:big").unwrap();
    for ch in channels.iter().take(3).chain([&big]) {
        engine.watch(ch).await.unwrap();
    }
    let mut reqs: Vec<_> = channels.iter().map(|ch| request(ch, "1")).collect();
    reqs.extend((0..300).map(|i| request(&big, &i.to_string())));
    let keyed = |ch: &ChannelName, key: &str| {
        let mut r = request(ch, "\"k\"");
        r.dedup = Some(Dedup { key: Arc::from(key), fingerprint: [7; 32], ttl: Duration::from_secs(60) });
        r
    };
    reqs.push(keyed(&channels[0], "twice"));
    reqs.push(keyed(&channels[0], "twice"));
    reqs.push(keyed(&channels[1], "twice"));
    let out = engine.append_batch(reqs).await;
    assert_eq!(out.len(), 703);
    for (i, r) in out[..400].iter().enumerate() {
        let r = r.as_ref().unwrap_or_else(|e| panic!("channel {i}: {e}"));
        assert_eq!((r.seq, r.duplicate), (Some(1), false), "channel {i}");
    }
    let seqs: Vec<_> = out[400..700].iter().map(|r| r.as_ref().unwrap().seq.unwrap()).collect();
    assert_eq!(seqs, (1..=300).collect::<Vec<_>>(), "one channel's messages in batch order");
    let first = out[700].as_ref().unwrap();
    let again = out[701].as_ref().unwrap();
    assert_eq!((first.seq, first.duplicate), (Some(2), false));
    assert_eq!((again.seq, again.duplicate), (Some(2), true), "the second use of a key is a duplicate");
    assert!(matches!(out[702], Err(herald_core::EngineError::IdempotencyMismatch)), "{:?}", out[702]);

    // The watched channels get theirs over pub/sub, in order.
    let got = sink.wait_for(&big, 300).await;
    assert_eq!(got.iter().map(|m| m.seq.unwrap()).collect::<Vec<_>>(), (1..=300).collect::<Vec<_>>());
    assert_eq!(sink.wait_for(&channels[0], 2).await.len(), 2);
    assert_eq!(engine.position(&channels[399]).await.unwrap().head, 1);
    engine.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_older_than_the_age_limit_leave_the_log() {
    testing::init_tracing();
    let redis = RedisServer::start();
    let engine = testing::engine(&redis.url()).await;
    let age = Duration::from_millis(400);
    let ch = ChannelName::new("chat:aged").unwrap();
    for i in 1..=3 {
        engine.append(aged(&ch, &i.to_string(), 0, age)).await.unwrap();
    }
    // Within the age nothing goes.
    engine.append(aged(&ch, "4", 0, age)).await.unwrap();
    assert_eq!(engine.position(&ch).await.unwrap().first, 1);
    tokio::time::sleep(age + Duration::from_millis(100)).await;
    engine.append(aged(&ch, "5", 0, age)).await.unwrap();
    let pos = engine.position(&ch).await.unwrap();
    assert_eq!((pos.first, pos.head), (5, 5), "the four old messages left");

    // The length limit moves the first entry on; the age check still finds
    // what is old among what is left.
    let ch2 = ChannelName::new("chat:aged-len").unwrap();
    for i in 1..=5 {
        engine.append(aged(&ch2, &i.to_string(), 3, age)).await.unwrap();
    }
    assert_eq!(engine.position(&ch2).await.unwrap().first, 3);
    tokio::time::sleep(age / 2).await;
    engine.append(aged(&ch2, "6", 3, age)).await.unwrap();
    tokio::time::sleep(age / 2 + Duration::from_millis(100)).await;
    engine.append(aged(&ch2, "7", 3, age)).await.unwrap();
    let pos = engine.position(&ch2).await.unwrap();
    assert_eq!((pos.first, pos.head), (6, 7), "3..=5 aged out, 6 is younger than the limit");

    // The log lost (its TTL, or Redis lost it) while the meta stayed: the
    // next message starts it again and is kept.
    redis.cli(&["DEL", "herald:{chat:aged-len}:log"]);
    tokio::time::sleep(age + Duration::from_millis(100)).await;
    engine.append(aged(&ch2, "8", 3, age)).await.unwrap();
    let page = engine.read(&ch2, 0, 10).await.unwrap();
    assert_eq!(page.messages.iter().map(|m| m.seq.unwrap()).collect::<Vec<_>>(), vec![8]);
    engine.close().await;
}
