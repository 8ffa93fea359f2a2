//! Pipelined socket publishes on the Redis engine: the frames a connection
//! sends back to back reach Redis as batches (one `APPEND` script run per
//! channel per batch, all in one pipeline), and still keep every promise of
//! one append at a time: replies in frame order, each channel in frame
//! order, one effect per idempotency key, and order across a script cache
//! that Redis lost (`NOSCRIPT`).

use std::collections::HashMap;

use herald_client::Connection;
use herald_test_support::{engine_config, next_message, next_reply, Node, RedisServer};
use serde_json::json;

const CHANNELS: [&str; 3] = ["chat:pa", "chat:pb", "chat:pc"];

/// Frames back to back: the default frame budget (100/s) would refuse them.
fn pipelining(c: &mut herald_server::Config) {
    c.rate_limits.client_frames_per_sec = 1_000_000;
    c.rate_limits.error_replies_per_sec = 1_000_000;
}

const N: u64 = 600;

/// Publish `i` goes to `CHANNELS[i % 3]` with `data` = i, and every fifth
/// carries the key `k{i}`; in the second half every tenth instead repeats
/// a keyed publish of the first half (its key, channel and data: a
/// duplicate). A key repeated within one pipeline would be refused as in
/// flight by the server before the engine sees it (the engine's handling
/// of a key used twice in one batch is in the conformance suite).
fn frame(i: u64) -> (serde_json::Value, Option<u64>) {
    let original = if i >= N / 2 && i % 10 == 9 { i - N / 2 - 5 } else { i };
    let ch = CHANNELS[(original % 3) as usize];
    let mut f = json!({ "type": "publish", "req": i + 1, "channel": ch, "data": original });
    if original % 5 == 4 {
        f["idempotency_key"] = format!("k{original}").into();
    }
    (f, (original != i).then_some(original))
}

/// Send publishes `range` back to back, then read their replies: each in
/// frame order, `ok`, the seqs of a channel rising by one in frame order
/// from `heads`, a repeated key answered with its original's seq.
async fn pipeline(
    conn: &mut Connection,
    range: std::ops::Range<u64>,
    heads: &mut HashMap<String, u64>,
    seq_of: &mut HashMap<u64, u64>,
) {
    for i in range.clone() {
        conn.send(&frame(i).0).await.expect("send publish");
    }
    for i in range {
        let r = next_reply(conn).await;
        assert_eq!((r.kind.as_str(), r.req), ("ok", Some(i + 1)), "replies in frame order: {r:?}");
        let ch = r.channel.clone().expect("channel");
        let seq = r.seq.expect("durable: a seq");
        match frame(i).1 {
            Some(original) => {
                assert_eq!(r.duplicate, Some(true), "publish {i} repeats the key of {original}");
                assert_eq!(Some(&seq), seq_of.get(&original), "with the original's seq");
            }
            None => {
                let head = heads.entry(ch.clone()).or_insert(0);
                assert_eq!(seq, *head + 1, "{ch}: seqs in frame order");
                *head = seq;
                seq_of.insert(i, seq);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_publishes_on_redis_keep_frame_order_and_dedup() {
    herald_test_support::init_tracing();
    let redis = RedisServer::start();
    let node = Node::on_redis_with(engine_config(&redis.url()), pipelining).await;
    let mut subs = Vec::new();
    for ch in CHANNELS {
        let mut s = node.connect("reader").await;
        s.subscribe(ch, None).await.expect("subscribe");
        subs.push(s);
    }
    let mut publisher = node.connect("writer").await;
    let (mut heads, mut seq_of) = (HashMap::new(), HashMap::new());
    pipeline(&mut publisher, 0..N / 2, &mut heads, &mut seq_of).await;
    // Redis forgets its scripts (as after a restart or a failover): the
    // next batches load them again without reordering anything.
    redis.cli(&["SCRIPT", "FLUSH"]);
    pipeline(&mut publisher, N / 2..N, &mut heads, &mut seq_of).await;

    // Every original once, in frame order, in each channel's log and at
    // its subscriber; no duplicate.
    for (k, ch) in CHANNELS.iter().enumerate() {
        let expected: Vec<u64> = (0..N).filter(|&i| frame(i).1.is_none() && i % 3 == k as u64).collect();
        let logged: Vec<u64> = node.history(ch).await.iter().map(|m| m["data"].as_u64().unwrap()).collect();
        assert_eq!(logged, expected, "{ch}: the log in frame order, once each");
        for (n, want) in expected.iter().enumerate() {
            let m = next_message(&mut subs[k]).await;
            assert_eq!(
                (m.seq, herald_test_support::data(&m)),
                (Some(n as u64 + 1), json!(want)),
                "{ch}: delivered in order"
            );
        }
    }
    node.stop().await;
}
