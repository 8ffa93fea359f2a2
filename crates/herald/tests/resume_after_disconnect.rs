//! Publish over HTTP, receive over WebSocket, disconnect, publish more,
//! resume with the last seq and get exactly the missed ones, then live.

use herald_test_support::*;
use serde_json::json;

#[tokio::test]
async fn resumes_with_exactly_the_missed_messages() {
    let srv = TestServer::start().await;
    let mut c = srv.connect("alice").await;
    let ok = c.subscribe("chat:r1", None).await.unwrap();
    assert_eq!(ok.kind, "ok");
    assert_eq!((ok.head, ok.first, ok.truncated), (Some(0), Some(1), Some(false)));
    let epoch = ok.epoch.clone().unwrap();

    for i in 1..=10 {
        let r = srv.publish("chat:r1", json!({ "n": i })).await;
        assert_eq!(r.status, 201, "{:?}", r.body);
        assert_eq!(r.body["seq"], i);
        assert_eq!(r.body["epoch"], epoch.as_str());
    }
    let got = next_messages(&mut c, 10).await;
    assert_eq!(seqs(&got), (1..=10).collect::<Vec<_>>());
    assert_eq!(got[3].data.as_ref().unwrap().get(), r#"{"n":4}"#);
    c.close(None, "bye").await.unwrap();

    for i in 11..=15 {
        assert_eq!(srv.publish("chat:r1", json!({ "n": i })).await.status, 201);
    }
    let mut c = srv.connect("alice").await;
    let ok = c.subscribe("chat:r1", Some((10, &epoch))).await.unwrap();
    assert_eq!((ok.head, ok.truncated, ok.epoch_changed), (Some(15), Some(false), None));
    let got = next_messages(&mut c, 5).await;
    assert_eq!(seqs(&got), vec![11, 12, 13, 14, 15]);
    // Then live, with no gap or duplicate at the seam.
    assert_eq!(srv.publish("chat:r1", json!({ "n": 16 })).await.status, 201);
    let got = next_messages(&mut c, 1).await;
    assert_eq!(seqs(&got), vec![16]);
    assert_silent(&mut c, std::time::Duration::from_millis(200)).await;
}

#[tokio::test]
async fn subscribe_without_since_gets_only_new_messages() {
    let srv = TestServer::start().await;
    for i in 1..=3 {
        assert_eq!(srv.publish("chat:r2", json!(i)).await.status, 201);
    }
    let mut c = srv.connect("bob").await;
    let ok = c.subscribe("chat:r2", None).await.unwrap();
    assert_eq!(ok.head, Some(3));
    assert_silent(&mut c, std::time::Duration::from_millis(200)).await;
    assert_eq!(srv.publish("chat:r2", json!(4)).await.status, 201);
    assert_eq!(seqs(&next_messages(&mut c, 1).await), vec![4]);
}

#[tokio::test]
async fn resume_from_zero_replays_the_whole_log_then_live() {
    let srv = TestServer::start().await;
    let mut epoch = String::new();
    for i in 1..=600 {
        let r = srv.publish("chat:r3", json!(i)).await;
        assert_eq!(r.status, 201);
        epoch = r.body["epoch"].as_str().unwrap().to_owned();
    }
    let mut c = srv.connect("carol").await;
    // 600 is more than one catch-up page: pages must join without a gap.
    let ok = c.subscribe("chat:r3", Some((0, &epoch))).await.unwrap();
    assert_eq!((ok.epoch_changed, ok.truncated, ok.head), (None, Some(false), Some(600)));
    let got = next_messages(&mut c, 600).await;
    assert_eq!(seqs(&got), (1..=600).collect::<Vec<_>>());
}
