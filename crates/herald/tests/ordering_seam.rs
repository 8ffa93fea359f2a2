//! Total order per channel and no gap or duplicate at the catch-up/live seam,
//! with publishes racing the subscribes.

use std::sync::Arc;

use herald_test_support::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_joining_mid_stream_see_every_seq_once_in_order() {
    const PUBLISHERS: usize = 8;
    const PER: usize = 100;
    const TOTAL: u64 = (PUBLISHERS * PER) as u64;
    let srv = Arc::new(TestServer::start().await);
    let mut early = srv.connect("early").await;
    let epoch = early.subscribe("chat:o1", None).await.unwrap().epoch.unwrap();

    let mut pubs = Vec::new();
    for p in 0..PUBLISHERS {
        let srv = srv.clone();
        pubs.push(tokio::spawn(async move {
            for i in 0..PER {
                let r = srv.publish("chat:o1", json!({ "p": p, "i": i })).await;
                assert_eq!(r.status, 201);
            }
        }));
    }
    // Join while publishes are in flight: one from the start of the log,
    // one from "now".
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    let mut from_zero = srv.connect("zero").await;
    let ok = from_zero.subscribe("chat:o1", Some((0, &epoch))).await.unwrap();
    assert_eq!(ok.truncated, Some(false));
    let mut from_now = srv.connect("now").await;
    let now_head = from_now.subscribe("chat:o1", None).await.unwrap().head.unwrap();

    for p in pubs {
        p.await.unwrap();
    }
    let a = next_messages(&mut early, TOTAL as usize).await;
    assert_eq!(seqs(&a), (1..=TOTAL).collect::<Vec<_>>());
    let b = next_messages(&mut from_zero, TOTAL as usize).await;
    assert_eq!(seqs(&b), (1..=TOTAL).collect::<Vec<_>>());
    let c = next_messages(&mut from_now, (TOTAL - now_head) as usize).await;
    assert_eq!(seqs(&c), (now_head + 1..=TOTAL).collect::<Vec<_>>());
    // Per-publisher order is kept inside the channel order.
    let mut last = [-1i64; PUBLISHERS];
    for m in &a {
        let v: serde_json::Value = serde_json::from_str(m.data.as_ref().unwrap().get()).unwrap();
        let (p, i) = (v["p"].as_u64().unwrap() as usize, v["i"].as_i64().unwrap());
        assert!(i > last[p]);
        last[p] = i;
    }
    for c in [&mut early, &mut from_zero, &mut from_now] {
        assert_silent(c, std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn channels_are_independent() {
    let srv = TestServer::start().await;
    let mut c = srv.connect("u").await;
    c.subscribe("chat:x", None).await.unwrap();
    c.subscribe("chat:y", None).await.unwrap();
    for i in 0..5 {
        srv.publish("chat:x", json!(i)).await;
        srv.publish("chat:y", json!(i)).await;
    }
    let msgs = next_messages(&mut c, 10).await;
    for ch in ["chat:x", "chat:y"] {
        let s: Vec<u64> =
            msgs.iter().filter(|m| m.channel.as_deref() == Some(ch)).map(|m| m.seq.unwrap()).collect();
        assert_eq!(s, vec![1, 2, 3, 4, 5], "{ch}");
    }
}
