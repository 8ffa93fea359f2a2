//! A subscriber that stops reading is disconnected with 4008 and loses
//! nothing: it resumes from its last seq.

use std::sync::Arc;

use herald_test_support::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_consumer_is_kicked_and_resumes_without_loss() {
    const TOTAL: u64 = 1200;
    let srv = Arc::new(TestServer::start_with(|c| c.websocket.outbox_capacity = 16).await);
    let mut slow = srv.connect("slow").await;
    let epoch = slow.subscribe("chat:s1", None).await.unwrap().epoch.unwrap();

    // 1200 x 32 KiB = ~38 MiB: far more than the socket buffers hold, so the
    // outbox fills while the client reads nothing.
    let blob = "x".repeat(32 * 1024);
    let mut tasks = Vec::new();
    for w in 0..8u64 {
        let srv = srv.clone();
        let blob = blob.clone();
        tasks.push(tokio::spawn(async move {
            for i in (w..TOTAL).step_by(8) {
                let r = srv.publish("chat:s1", json!({ "i": i, "blob": blob })).await;
                assert_eq!(r.status, 201);
            }
        }));
    }
    let state = srv.state.clone();
    assert_eventually("slow consumer kicked", || {
        let state = state.clone();
        async move { state.metrics.render().contains("herald_slow_consumer_disconnects_total 1") }
    })
    .await;

    let (frames, code) = read_until_closed(&mut slow).await;
    assert_eq!(code, Some(4008));
    let disconnect =
        frames.iter().find(|f| f.kind == "disconnect").expect("a disconnect frame before the close");
    assert_eq!(disconnect.reconnect, Some(true));
    let got: Vec<u64> = frames.iter().filter(|f| f.kind == "message").map(|f| f.seq.unwrap()).collect();
    assert_eq!(got, (1..=got.len() as u64).collect::<Vec<_>>(), "what arrived is in order, gap-free");

    for t in tasks {
        t.await.unwrap();
    }
    // Resume: exactly the rest.
    let last = got.len() as u64;
    let mut again = srv.connect("slow").await;
    let ok = again.subscribe("chat:s1", Some((last, &epoch))).await.unwrap();
    assert_eq!(ok.head, Some(TOTAL));
    let rest = next_messages(&mut again, (TOTAL - last) as usize).await;
    assert_eq!(seqs(&rest), (last + 1..=TOTAL).collect::<Vec<_>>());
}

#[tokio::test]
async fn volatile_messages_are_dropped_not_kicked() {
    // A volatile channel never kicks: a full outbox drops and counts.
    let srv = TestServer::start_with(|c| c.websocket.outbox_capacity = 16).await;
    let mut c = srv.connect("v").await;
    assert_eq!(c.subscribe("live:v1", None).await.unwrap().kind, "ok");
    let r = srv.publish("live:v1", json!({ "typing": true })).await;
    assert_eq!(r.status, 202, "volatile publishes are accepted, not stored");
    assert!(r.body.get("seq").is_none());
    let m = next_frame(&mut c).await;
    assert_eq!((m.kind.as_str(), m.seq), ("message", None));
    let h = srv.get("/api/v1/channels/live:v1/messages").await;
    assert_eq!((h.status, h.code()), (405, "not_supported"));
}
