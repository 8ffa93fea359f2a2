//! Every Idempotency-Key case of the HTTP API and the socket publish.

use herald_test_support::*;
use serde_json::json;

#[tokio::test]
async fn same_key_same_body_replays_the_original_result() {
    let srv = TestServer::start().await;
    let body = json!({ "data": { "order": 1 }, "meta": { "trace_id": "t-1" } });
    let first = srv.publish_with("chat:i1", body.clone(), Some("key-1"), Some(API_KEY)).await;
    assert_eq!(first.status, 201);
    assert!(first.headers.get("idempotent-replayed").is_none());
    let again = srv.publish_with("chat:i1", body, Some("key-1"), Some(API_KEY)).await;
    assert_eq!(again.status, 201);
    assert_eq!(again.body, first.body, "same status and body");
    assert_eq!(again.headers.get("idempotent-replayed").unwrap(), "true");
    let hist = srv.history("chat:i1").await;
    assert_eq!(hist.len(), 1, "nothing appended by the replay");
    assert_eq!(hist[0]["meta"]["trace_id"], "t-1");
}

#[tokio::test]
async fn same_key_different_body_is_422() {
    let srv = TestServer::start().await;
    let a = srv.publish_with("chat:i2", json!({ "data": 1 }), Some("key-2"), Some(API_KEY)).await;
    assert_eq!(a.status, 201);
    let b = srv.publish_with("chat:i2", json!({ "data": 2 }), Some("key-2"), Some(API_KEY)).await;
    assert_eq!((b.status, b.code()), (422, "idempotency_key_reused"));
    assert!(b.is_problem());
    // Same key on another channel is a different request too.
    let c = srv.publish_with("chat:i2b", json!({ "data": 1 }), Some("key-2"), Some(API_KEY)).await;
    assert_eq!((c.status, c.code()), (422, "idempotency_key_reused"));
    assert_eq!(srv.history("chat:i2").await.len(), 1);
    assert_eq!(srv.history("chat:i2b").await.len(), 0);
}

#[tokio::test]
async fn keys_are_scoped_per_api_key() {
    let srv = TestServer::start().await;
    let body = json!({ "data": "x" });
    let a = srv.publish_with("chat:i3", body.clone(), Some("shared"), Some(API_KEY)).await;
    let b = srv.publish_with("chat:i3", body, Some("shared"), Some(API_KEY_2)).await;
    assert_eq!((a.status, b.status), (201, 201));
    assert!(b.headers.get("idempotent-replayed").is_none());
    assert_eq!((a.body["seq"].as_u64(), b.body["seq"].as_u64()), (Some(1), Some(2)));
}

#[tokio::test]
async fn malformed_and_missing_keys_are_400() {
    let srv = TestServer::start_with(|c| {
        c.namespaces.0.insert(
            "orders".into(),
            herald_core::NamespaceOptions { require_idempotency_key: true, ..Default::default() },
        );
    })
    .await;
    let r = srv.publish_with("orders:1", json!({ "data": 1 }), None, Some(API_KEY)).await;
    assert_eq!((r.status, r.code()), (400, "idempotency_key_required"));
    let long = "k".repeat(256);
    let r = srv.publish_with("orders:1", json!({ "data": 1 }), Some(&long), Some(API_KEY)).await;
    assert_eq!((r.status, r.code()), (400, "idempotency_key_invalid"));
    let r = srv
        .post_raw(
            "/api/v1/channels/orders:1/messages",
            br#"{"data":1}"#.to_vec(),
            &[("authorization", &format!("Bearer {API_KEY}")), ("idempotency-key", "")],
        )
        .await;
    assert_eq!((r.status, r.code()), (400, "idempotency_key_invalid"));
    let ok = srv.publish_with("orders:1", json!({ "data": 1 }), Some(&"k".repeat(255)), Some(API_KEY)).await;
    assert_eq!(ok.status, 201);
    assert_eq!(srv.history("orders:1").await.len(), 1);
}

#[tokio::test]
async fn fifty_concurrent_same_key_requests_append_once() {
    let srv = std::sync::Arc::new(TestServer::start().await);
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let srv = srv.clone();
        tasks.push(tokio::spawn(async move {
            srv.publish_with("chat:i5", json!({ "data": { "pay": 100 } }), Some("once"), Some(API_KEY)).await
        }));
    }
    let mut created = Vec::new();
    for t in tasks {
        let r = t.await.unwrap();
        match r.status {
            201 => created.push(r.body),
            409 => assert_eq!(r.code(), "idempotency_key_in_flight"),
            other => panic!("unexpected {other}: {:?}", r.body),
        }
    }
    assert!(!created.is_empty());
    assert!(created.iter().all(|b| b == &created[0]), "every success names the same message");
    let hist = srv.history("chat:i5").await;
    assert_eq!(hist.len(), 1, "exactly one message");
    assert_eq!(hist[0]["id"], created[0]["id"]);
}

#[tokio::test]
async fn batch_publish_is_exactly_once_as_a_whole() {
    let srv = TestServer::start().await;
    let body = json!({ "channels": ["chat:b1", "chat:b2", "user:b3"], "data": { "hello": true } });
    let auth = format!("Bearer {API_KEY}");
    let headers = [
        ("authorization", auth.as_str()),
        ("idempotency-key", "batch-1"),
        ("content-type", "application/json"),
    ];
    let first = srv.post_raw("/api/v1/publish", serde_json::to_vec(&body).unwrap(), &headers).await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    let results = first.body["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    assert!(results.iter().all(|r| r["seq"] == 1));
    let again = srv.post_raw("/api/v1/publish", serde_json::to_vec(&body).unwrap(), &headers).await;
    assert_eq!(again.status, 201);
    assert_eq!(again.body, first.body);
    assert_eq!(again.headers.get("idempotent-replayed").unwrap(), "true");
    for ch in ["chat:b1", "chat:b2", "user:b3"] {
        assert_eq!(srv.history(ch).await.len(), 1, "{ch}");
    }
    let other = json!({ "channels": ["chat:b1"], "data": { "hello": true } });
    let r = srv.post_raw("/api/v1/publish", serde_json::to_vec(&other).unwrap(), &headers).await;
    assert_eq!((r.status, r.code()), (422, "idempotency_key_reused"));
}

#[tokio::test]
async fn socket_publish_with_a_key_is_exactly_once() {
    let srv = TestServer::start().await;
    let mut c = srv.connect("dave").await;
    let a = c.publish("chat:i7", &json!({ "t": "hi" }), Some("k1")).await.unwrap();
    assert_eq!((a.kind.as_str(), a.seq, a.duplicate), ("ok", Some(1), Some(false)));
    let b = c.publish("chat:i7", &json!({ "t": "hi" }), Some("k1")).await.unwrap();
    assert_eq!((b.seq, b.duplicate, b.id.as_deref()), (Some(1), Some(true), a.id.as_deref()));
    let e = c.publish("chat:i7", &json!({ "t": "changed" }), Some("k1")).await.unwrap();
    assert_eq!(e.kind, "error");
    assert_eq!(e.code, Some(json!("idempotency_key_reused")));
    // Another user's identical key is its own scope.
    let mut other = srv.connect("erin").await;
    let o = other.publish("chat:i7", &json!({ "t": "hi" }), Some("k1")).await.unwrap();
    assert_eq!((o.seq, o.duplicate), (Some(2), Some(false)));
    assert_eq!(srv.history("chat:i7").await.len(), 2);
}
