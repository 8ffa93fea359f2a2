//! Pipelined publishes on one socket: many `publish` frames in flight on a
//! connection keep their frame order in the channel, each gets its own
//! reply (in frame order, `ok` only once durable), a storage failure in the
//! middle never reorders, and a connection that closes with publishes in
//! flight leaves nothing a retry under the same keys would duplicate.

use std::collections::HashSet;

use herald_client::{Connection, ServerEvent};
use herald_test_support::*;
use serde_json::json;

/// Frames back to back: the default frame budget (100/s) would refuse
/// them, and the default error-reply budget would drop most error replies.
fn pipelining(c: &mut herald_server::Config) {
    c.rate_limits.client_frames_per_sec = 1_000_000;
    c.rate_limits.error_replies_per_sec = 1_000_000;
}

/// Send `count` publishes to `channel` without waiting, `data` = index,
/// with `req` = index + 1 and, with `keyed`, the key `k{index}`.
async fn send_publishes(conn: &mut Connection, channel: &str, range: std::ops::Range<u64>, keyed: bool) {
    for i in range {
        let mut frame = json!({ "type": "publish", "req": i + 1, "channel": channel, "data": i });
        if keyed {
            frame["idempotency_key"] = format!("k{i}").into();
        }
        conn.send(&frame).await.expect("send publish");
    }
}

#[tokio::test]
async fn pipelined_publishes_keep_frame_order_with_a_small_in_flight_bound() {
    let srv = TestServer::start_with(|c| {
        pipelining(c);
        // Far below the frames sent: the socket is not read while full.
        c.websocket.max_publishes_in_flight = 8;
    })
    .await;
    let mut sub = srv.connect("reader").await;
    sub.subscribe("chat:pipe", None).await.unwrap();
    let mut publisher = srv.connect("writer").await;
    const N: u64 = 600;
    let sender = async {
        send_publishes(&mut publisher, "chat:pipe", 0..N, false).await;
        publisher
    };
    let mut publisher = sender.await;
    for i in 0..N {
        let r = next_reply(&mut publisher).await;
        assert_eq!((r.kind.as_str(), r.req), ("ok", Some(i + 1)), "replies in frame order: {r:?}");
        assert_eq!(r.seq, Some(i + 1), "the channel's order is the frames' order");
        assert_eq!(r.channel.as_deref(), Some("chat:pipe"));
    }
    // The subscriber sees them in the same order, each once.
    for i in 0..N {
        let m = loop {
            let ev = tokio::time::timeout(WAIT, sub.next_frame()).await.unwrap().unwrap().unwrap();
            if let ServerEvent::Frame(v) = ev {
                if v.kind == "message" {
                    break v;
                }
            }
        };
        assert_eq!(m.seq, Some(i + 1));
        assert_eq!(m.data.as_ref().map(|d| d.get()), Some(i.to_string().as_str()));
    }
    // Another frame after the pipeline is answered after every publish.
    assert_eq!(publisher.ping().await.unwrap().kind, "pong");
    let history = srv.history("chat:pipe").await;
    let data: Vec<u64> = history.iter().map(|m| m["data"].as_u64().unwrap()).collect();
    assert_eq!(data, (0..N).collect::<Vec<_>>());
}

#[tokio::test]
async fn the_bytes_in_flight_bound_stops_reading_once_reached() {
    let srv = TestServer::start_with(|c| {
        pipelining(c);
        // Far above the frames sent: only the bytes bound applies.
        c.websocket.max_publishes_in_flight = 10_000;
        c.websocket.max_publish_bytes_in_flight = 1_000;
    })
    .await;
    let mut publisher = srv.connect("writer").await;
    const N: u64 = 120;
    // Each `data` is a 400-character string (402 bytes of JSON): reading
    // stops at the third, so at most three are in flight at any time.
    let filler = "x".repeat(400);
    let before = srv.engine.stats();
    for i in 0..N {
        let frame = json!({ "type": "publish", "req": i + 1, "channel": "chat:bytes", "data": filler });
        publisher.send(&frame).await.expect("send publish");
    }
    for i in 0..N {
        let r = next_reply(&mut publisher).await;
        assert_eq!((r.kind.as_str(), r.req, r.seq), ("ok", Some(i + 1), Some(i + 1)), "{r:?}");
    }
    let after = srv.engine.stats();
    assert_eq!(after.appends - before.appends, N);
    // Only this connection writes, one batch with the engine at a time:
    // every group commit carried at most the three in flight.
    let commits = after.batches - before.batches;
    assert!(commits >= N / 3, "{commits} group commits for {N} publishes of which at most 3 were in flight");
}

#[tokio::test]
async fn a_storage_failure_mid_pipeline_never_reorders() {
    let srv = TestServer::start_with(pipelining).await;
    let mut c = srv.connect("writer").await;
    const HALF: u64 = 150;
    send_publishes(&mut c, "chat:fail", 0..HALF, false).await;
    // The first reply is in: the engine fails on its next commit, with the
    // rest of the first half in flight or still to come.
    let first = next_reply(&mut c).await;
    assert_eq!((first.kind.as_str(), first.seq), ("ok", Some(1)), "{first:?}");
    srv.engine.inject_failure();
    send_publishes(&mut c, "chat:fail", HALF..2 * HALF, false).await;

    let mut replies = vec![first];
    for _ in 1..2 * HALF {
        replies.push(next_reply(&mut c).await);
    }
    // Frame order, one reply each; a prefix succeeded with seqs in frame
    // order, and from the failed one on everything failed (fail-stop).
    let ok = replies.iter().take_while(|r| r.kind == "ok").count();
    assert!(ok >= 1 && ok <= HALF as usize, "{ok} ok");
    for (i, r) in replies.iter().enumerate() {
        assert_eq!(r.req, Some(i as u64 + 1), "replies in frame order");
        if i < ok {
            assert_eq!(r.seq, Some(i as u64 + 1), "{r:?}");
        } else {
            assert_eq!((r.kind.as_str(), r.code.clone()), ("error", Some(json!("unavailable"))), "{r:?}");
        }
    }
    // The log holds exactly the acknowledged prefix, in order.
    let data: Vec<u64> = srv.history("chat:fail").await.iter().map(|m| m["data"].as_u64().unwrap()).collect();
    assert_eq!(data, (0..ok as u64).collect::<Vec<_>>());
}

#[tokio::test]
async fn closing_with_publishes_in_flight_leaves_nothing_a_retry_duplicates() {
    let srv = TestServer::start_with(pipelining).await;
    const N: u64 = 300;
    let mut first = srv.connect("writer").await;
    send_publishes(&mut first, "chat:retry", 0..N, true).await;
    // Some are answered, some in flight, some unread: close abruptly.
    let r = next_reply(&mut first).await;
    assert_eq!(r.kind, "ok", "{r:?}");
    drop(first);

    // The retry under the same keys (same user: keys are scoped per user).
    let mut retry = srv.connect("writer").await;
    let mut pending: Vec<u64> = (0..N).collect();
    let mut fresh = 0;
    for _round in 0..200 {
        if pending.is_empty() {
            break;
        }
        for &i in &pending {
            let frame = json!({
                "type": "publish", "req": i + 1, "channel": "chat:retry", "data": i,
                "idempotency_key": format!("k{i}"),
            });
            retry.send(&frame).await.unwrap();
        }
        let mut again = Vec::new();
        for &i in &pending {
            let r = next_reply(&mut retry).await;
            assert_eq!(r.req, Some(i + 1));
            match (r.kind.as_str(), r.code.as_ref().and_then(|c| c.as_str())) {
                ("ok", _) => fresh += u64::from(r.duplicate != Some(true)),
                // The first connection's publish under this key is still
                // being processed on this node.
                ("error", Some("idempotency_key_in_flight")) => again.push(i),
                _ => panic!("unexpected reply to the retry: {r:?}"),
            }
        }
        pending = again;
        if !pending.is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    assert!(pending.is_empty(), "retries still refused: {pending:?}");
    // Exactly one effect per key: each message once, whichever connection
    // appended it.
    let data: Vec<u64> =
        srv.history("chat:retry").await.iter().map(|m| m["data"].as_u64().unwrap()).collect();
    assert_eq!(data.len() as u64, N, "one message per key: {data:?}");
    assert_eq!(data.iter().copied().collect::<HashSet<_>>(), (0..N).collect::<HashSet<_>>());
    assert!(fresh < N, "the first connection's committed publishes are replays on retry");
}

#[tokio::test]
async fn publishes_sent_before_a_close_frame_are_appended() {
    let srv = TestServer::start_with(pipelining).await;
    let mut c = srv.connect("writer").await;
    const N: u64 = 200;
    send_publishes(&mut c, "chat:closing", 0..N, false).await;
    // A clean close right behind the frames, without reading the replies.
    let _ = tokio::time::timeout(WAIT, c.close(Some(1000), "done")).await.expect("closed in time");
    let mut data = Vec::new();
    for _ in 0..200 {
        data = srv.history("chat:closing").await.iter().map(|m| m["data"].as_u64().unwrap()).collect();
        if data.len() as u64 == N {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(data, (0..N).collect::<Vec<_>>(), "every publish before the close, once, in frame order");
}
