//! A storage error makes the engine fail-stop: publishes get 503 (never a
//! 2xx), readiness fails, sockets stay up, and a restart recovers.

use herald_test_support::*;
use serde_json::json;

#[tokio::test]
async fn storage_failure_is_503_and_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let srv = TestServer::start_in(dir.path().to_path_buf(), |_| {}).await;
    assert_eq!(srv.publish("chat:f", json!(1)).await.status, 201);
    let mut c = srv.connect("u").await;
    c.subscribe("chat:f", None).await.unwrap();

    srv.engine.inject_failure();
    for i in 0..5 {
        let r = srv.publish_with("chat:f", json!({ "data": i }), Some(&format!("k{i}")), Some(API_KEY)).await;
        assert_eq!((r.status, r.code()), (503, "unavailable"), "{:?}", r.body);
        assert!(r.headers.get("retry-after").is_some());
    }
    let ready = srv.get("/readyz").await;
    assert_eq!((ready.status, ready.code()), (503, "unavailable"));
    assert_eq!(srv.get("/healthz").await.status, 200, "alive, just not ready");
    // The socket stays up and reads still work.
    assert_eq!(c.ping().await.unwrap().kind, "pong");
    let e = c.publish("chat:f", &json!("x"), None).await.unwrap();
    assert_eq!(e.code, Some(json!("unavailable")));
    assert_eq!(srv.history("chat:f").await.len(), 1);

    drop(c);
    srv.stop().await;
    let srv = TestServer::start_in(dir.path().to_path_buf(), |_| {}).await;
    assert_eq!(srv.get("/readyz").await.status, 200);
    let r = srv.publish("chat:f", json!(2)).await;
    assert_eq!(r.status, 201);
    assert!(r.body["seq"].as_u64().unwrap() >= 2);
}
