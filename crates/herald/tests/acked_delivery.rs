//! Acked delivery: redelivery with backoff, the offline inbox, per-device
//! cursors, flow control, retention, ack errors, receipts.

use std::time::{Duration, Instant};

use herald_client::{ConnectOptions, Connection};
use herald_core::{Delivery, NamespaceOptions};
use herald_test_support::*;
use serde_json::json;

fn acked(tweak: impl FnOnce(&mut NamespaceOptions)) -> NamespaceOptions {
    let mut ns = NamespaceOptions { delivery: Delivery::Acked, ..Default::default() };
    tweak(&mut ns);
    ns
}

async fn server(ns: NamespaceOptions) -> TestServer {
    TestServer::start_with(move |c| {
        c.namespaces.0.insert("inbox".into(), ns);
    })
    .await
}

async fn connect(srv: &TestServer, user: &str, device: Option<&str>) -> Connection {
    let mut opts = ConnectOptions::dev_user(&srv.url, user);
    opts.device = device.map(str::to_owned);
    Connection::connect(&opts).await.expect("connect")
}

async fn ack(c: &mut Connection, channel: &str, seq: u64) {
    let r = c.request(json!({ "type": "ack", "channel": channel, "seq": seq })).await.unwrap();
    assert_eq!(r.kind, "ok", "ack {seq}: {r:?}");
}

#[tokio::test]
async fn redelivers_an_unacked_message_after_the_timeout_and_stops_after_the_ack() {
    let srv = server(acked(|n| n.ack_timeout = Duration::from_millis(200))).await;
    let mut c = connect(&srv, "u1", None).await;
    c.subscribe("inbox:a", None).await.unwrap();
    srv.publish("inbox:a", json!("hello")).await;
    let first = next_frame(&mut c).await;
    assert_eq!((first.seq, first.redelivered), (Some(1), None));
    let again = next_frame(&mut c).await;
    assert_eq!((again.seq, again.redelivered, again.attempt), (Some(1), Some(true), Some(2)));
    assert_eq!(again.id, first.id);
    ack(&mut c, "inbox:a", 1).await;
    assert_silent(&mut c, Duration::from_millis(800)).await;
}

#[tokio::test]
async fn backoff_grows_and_stops_at_max_attempts() {
    let srv = server(acked(|n| {
        n.ack_timeout = Duration::from_millis(200);
        n.max_attempts = 3;
    }))
    .await;
    let mut c = connect(&srv, "u2", None).await;
    c.subscribe("inbox:b", None).await.unwrap();
    srv.publish("inbox:b", json!(1)).await;
    let mut at = Vec::new();
    for attempt in 1..=3 {
        let f = next_frame(&mut c).await;
        assert_eq!(f.seq, Some(1));
        assert_eq!(f.attempt, (attempt > 1).then_some(attempt));
        at.push(Instant::now());
    }
    let (gap1, gap2) = (at[1] - at[0], at[2] - at[1]);
    assert!(gap2.as_secs_f64() > gap1.as_secs_f64() * 1.2, "backoff grows: {gap1:?} then {gap2:?}");
    // max_attempts reached: no more pushes on this connection...
    assert_silent(&mut c, Duration::from_millis(1500)).await;
    let m = reqwest::get(format!("{}/metrics", srv.url)).await.unwrap().text().await.unwrap();
    assert!(m.contains("herald_acked_stale_total 1"), "{m}");
    // ...and the message waits in the inbox for the next resume.
    drop(c);
    let mut c = connect(&srv, "u2", None).await;
    let ok = c.subscribe("inbox:b", None).await.unwrap();
    assert_eq!((ok.cursor, ok.unread), (Some(0), Some(1)));
    assert_eq!(next_frame(&mut c).await.seq, Some(1));
}

#[tokio::test]
async fn offline_inbox_delivers_exactly_what_was_missed() {
    let srv = TestServer::start().await; // `user:` is acked by default
    let mut c = connect(&srv, "alice", None).await;
    c.subscribe("user:alice", None).await.unwrap();
    c.close(None, "").await.unwrap();
    for i in 1..=100 {
        assert_eq!(srv.publish("user:alice", json!({ "n": i })).await.status, 201);
    }
    let mut c = connect(&srv, "alice", None).await;
    let ok = c.subscribe("user:alice", None).await.unwrap();
    assert_eq!((ok.cursor, ok.unread, ok.head), (Some(0), Some(100), Some(100)));
    let got = next_messages(&mut c, 100).await;
    assert_eq!(seqs(&got), (1..=100).collect::<Vec<_>>());
    ack(&mut c, "user:alice", 100).await;
    c.close(None, "").await.unwrap();

    let mut c = connect(&srv, "alice", None).await;
    let ok = c.subscribe("user:alice", None).await.unwrap();
    assert_eq!((ok.cursor, ok.unread), (Some(100), Some(0)));
    assert_silent(&mut c, Duration::from_millis(300)).await;

    let inbox = srv.get("/api/v1/users/alice/inbox").await;
    assert_eq!(inbox.status, 200, "{:?}", inbox.body);
    let ch = &inbox.body["channels"][0];
    assert_eq!((ch["channel"].as_str(), ch["head"].as_u64()), (Some("user:alice"), Some(100)));
    assert_eq!(ch["devices"][0]["cursor"], 100);
    assert_eq!(ch["devices"][0]["unread"], 0);
}

#[tokio::test]
async fn device_cursors_are_independent() {
    let srv = TestServer::start().await;
    let mut a = connect(&srv, "bob", Some("phone")).await;
    let mut b = connect(&srv, "bob", Some("laptop")).await;
    a.subscribe("user:bob", None).await.unwrap();
    b.subscribe("user:bob", None).await.unwrap();
    for i in 1..=5 {
        srv.publish("user:bob", json!(i)).await;
    }
    assert_eq!(next_messages(&mut a, 5).await.len(), 5);
    assert_eq!(next_messages(&mut b, 5).await.len(), 5);
    ack(&mut a, "user:bob", 5).await;
    ack(&mut b, "user:bob", 2).await;
    drop((a, b));

    let mut a = connect(&srv, "bob", Some("phone")).await;
    let mut b = connect(&srv, "bob", Some("laptop")).await;
    assert_eq!(a.subscribe("user:bob", None).await.unwrap().cursor, Some(5));
    assert_eq!(b.subscribe("user:bob", None).await.unwrap().cursor, Some(2));
    assert_silent(&mut a, Duration::from_millis(200)).await;
    assert_eq!(seqs(&next_messages(&mut b, 3).await), vec![3, 4, 5]);

    let r = srv.get("/api/v1/channels/user:bob/cursors").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let mut list: Vec<(String, u64, u64)> = r.body["cursors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["device"].as_str().unwrap().to_owned(),
                c["cursor"].as_u64().unwrap(),
                c["unread"].as_u64().unwrap(),
            )
        })
        .collect();
    list.sort();
    assert_eq!(list, vec![("laptop".into(), 2, 3), ("phone".into(), 5, 0)]);
}

#[tokio::test]
async fn flow_control_never_exceeds_max_inflight() {
    let srv = server(acked(|n| {
        n.max_inflight = 10;
        n.ack_timeout = Duration::from_secs(30);
        n.ack_backoff_max = Duration::from_secs(60);
    }))
    .await;
    for i in 1..=30 {
        srv.publish("inbox:f", json!(i)).await;
    }
    let mut c = connect(&srv, "f", None).await;
    c.subscribe("inbox:f", None).await.unwrap();
    assert_eq!(seqs(&next_messages(&mut c, 10).await), (1..=10).collect::<Vec<_>>());
    assert_silent(&mut c, Duration::from_millis(300)).await;
    // Live messages wait for the window too.
    for i in 31..=40 {
        srv.publish("inbox:f", json!(i)).await;
    }
    assert_silent(&mut c, Duration::from_millis(300)).await;
    ack(&mut c, "inbox:f", 4).await;
    assert_eq!(seqs(&next_messages(&mut c, 4).await), vec![11, 12, 13, 14]);
    assert_silent(&mut c, Duration::from_millis(300)).await;
    // Drain the rest, acking as we go: in order, never more than 10 out.
    let mut next = 15;
    while next <= 40 {
        let acked = next - 1;
        ack(&mut c, "inbox:f", acked).await;
        // The window admits exactly up to acked + 10.
        let n = (acked + 10 + 1).min(41) - next;
        let got = next_messages(&mut c, n as usize).await;
        assert_eq!(seqs(&got), (next..next + n).collect::<Vec<_>>());
        next += n;
        assert_silent(&mut c, Duration::from_millis(100)).await;
    }
    ack(&mut c, "inbox:f", 40).await;
    let r = srv.get("/api/v1/channels/inbox:f/cursors").await;
    assert_eq!(r.body["cursors"][0]["cursor"], 40);
    assert_eq!(r.body["cursors"][0]["unread"], 0);
}

#[tokio::test]
async fn retention_truncation_is_reported_and_counted() {
    let srv = server(acked(|n| n.history_size = 10)).await;
    let mut c = connect(&srv, "t", None).await;
    c.subscribe("inbox:t", None).await.unwrap();
    for i in 1..=5 {
        srv.publish("inbox:t", json!(i)).await;
    }
    assert_eq!(next_messages(&mut c, 5).await.len(), 5);
    ack(&mut c, "inbox:t", 5).await;
    drop(c);
    for i in 6..=35 {
        srv.publish("inbox:t", json!(i)).await;
    }
    let mut c = connect(&srv, "t", None).await;
    let ok = c.subscribe("inbox:t", None).await.unwrap();
    assert_eq!((ok.truncated, ok.first, ok.cursor), (Some(true), Some(26), Some(5)));
    assert_eq!(seqs(&next_messages(&mut c, 10).await), (26..=35).collect::<Vec<_>>());
    let m = reqwest::get(format!("{}/metrics", srv.url)).await.unwrap().text().await.unwrap();
    assert!(m.contains("herald_acked_truncated_total 20"), "{m}");
}

#[tokio::test]
async fn bad_acks_get_errors() {
    let srv = TestServer::start().await;
    let mut c = connect(&srv, "e", None).await;
    let r = c.request(json!({ "type": "ack", "channel": "user:e", "seq": 1 })).await.unwrap();
    assert_eq!(r.code, Some(json!("not_subscribed")));
    c.subscribe("chat:d", None).await.unwrap();
    let r = c.request(json!({ "type": "ack", "channel": "chat:d", "seq": 1 })).await.unwrap();
    assert_eq!(r.code, Some(json!("not_supported")));
    c.subscribe("user:e", None).await.unwrap();
    srv.publish("user:e", json!(1)).await;
    assert_eq!(next_messages(&mut c, 1).await.len(), 1);
    let r = c.request(json!({ "type": "ack", "channel": "user:e", "seq": 2 })).await.unwrap();
    assert_eq!(r.code, Some(json!("bad_request")), "seq 2 was never delivered");
    // Acks are idempotent: acking twice is fine.
    ack(&mut c, "user:e", 1).await;
    ack(&mut c, "user:e", 1).await;
    let r = srv.get("/api/v1/channels/chat:d/cursors").await;
    assert_eq!((r.status, r.code()), (405, "not_supported"));
}

#[tokio::test]
async fn acks_do_not_count_against_the_frame_budget() {
    // A client that acks every message must be able to drain an inbox far
    // faster than `client_frames_per_sec`.
    let srv = TestServer::start_with(|c| c.rate_limits.client_frames_per_sec = 10).await;
    for i in 1..=300 {
        srv.publish("user:fast", json!(i)).await;
    }
    let mut c = connect(&srv, "fast", None).await;
    c.subscribe("user:fast", None).await.unwrap();
    for seq in 1..=300u64 {
        let m = next_frame(&mut c).await;
        assert_eq!((m.kind.as_str(), m.seq), ("message", Some(seq)));
        c.send(&json!({ "type": "ack", "channel": "user:fast", "seq": seq })).await.unwrap();
    }
    ack(&mut c, "user:fast", 300).await;
    // Other frames are still limited.
    let mut limited = false;
    for _ in 0..30 {
        if c.ping().await.unwrap().code == Some(json!("rate_limited")) {
            limited = true;
        }
    }
    assert!(limited, "pings beyond the budget are refused");
}
