//! Retention and resume: truncated and epoch-changed replies are explicit.

use herald_test_support::*;
use serde_json::json;

async fn server() -> TestServer {
    TestServer::start_with(|c| {
        c.namespaces.0.insert(
            "short".into(),
            herald_core::NamespaceOptions { history_size: 10, client_publish: true, ..Default::default() },
        );
    })
    .await
}

#[tokio::test]
async fn resume_behind_retention_says_truncated_and_starts_at_first() {
    let srv = server().await;
    let mut epoch = String::new();
    for i in 1..=30 {
        let r = srv.publish("short:t1", json!(i)).await;
        assert_eq!(r.status, 201);
        epoch = r.body["epoch"].as_str().unwrap().into();
    }
    let mut c = srv.connect("t").await;
    let ok = c.subscribe("short:t1", Some((5, &epoch))).await.unwrap();
    assert_eq!((ok.truncated, ok.first, ok.head), (Some(true), Some(21), Some(30)));
    assert_eq!(seqs(&next_messages(&mut c, 10).await), (21..=30).collect::<Vec<_>>());

    // Exactly at the edge (since = first - 1) is not truncated.
    let mut c2 = srv.connect("t2").await;
    let ok = c2.subscribe("short:t1", Some((20, &epoch))).await.unwrap();
    assert_eq!(ok.truncated, Some(false));
    assert_eq!(seqs(&next_messages(&mut c2, 10).await), (21..=30).collect::<Vec<_>>());

    let hist = srv.history("short:t1").await;
    assert_eq!(hist.first().unwrap()["seq"], 21);
}

#[tokio::test]
async fn wrong_epoch_says_so_and_starts_at_first() {
    let srv = server().await;
    for i in 1..=3 {
        srv.publish("short:t2", json!(i)).await;
    }
    let mut c = srv.connect("t").await;
    let ok = c.subscribe("short:t2", Some((2, "some-old-epoch"))).await.unwrap();
    assert_eq!((ok.epoch_changed, ok.first), (Some(true), Some(1)));
    assert_eq!(seqs(&next_messages(&mut c, 3).await), vec![1, 2, 3]);
}

#[tokio::test]
async fn since_beyond_head_is_a_clear_error() {
    let srv = server().await;
    let r = srv.publish("short:t3", json!(1)).await;
    let epoch = r.body["epoch"].as_str().unwrap().to_owned();
    let mut c = srv.connect("t").await;
    let e = c.subscribe("short:t3", Some((99, &epoch))).await.unwrap();
    assert_eq!((e.kind.as_str(), e.code), ("error", Some(json!("bad_request"))));
}
