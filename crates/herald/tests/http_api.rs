//! HTTP API errors (problem+json with stable codes), history, operations.

use herald_test_support::*;
use serde_json::json;

#[tokio::test]
async fn publish_errors_are_problem_json_with_stable_codes() {
    let srv = TestServer::start_with(|c| c.http.max_body_bytes = 1024).await;
    let r = srv.publish("nowhere:1", json!(1)).await;
    assert_eq!((r.status, r.code()), (404, "unknown_namespace"));
    assert!(r.is_problem());
    let r = srv.publish("chat:bad%20name", json!(1)).await;
    assert_eq!((r.status, r.code()), (400, "bad_channel"));
    let auth = format!("Bearer {API_KEY}");
    let h = [("authorization", auth.as_str()), ("content-type", "application/json")];
    let r = srv.post_raw("/api/v1/channels/chat:e/messages", b"{\"data\": ".to_vec(), &h).await;
    assert_eq!((r.status, r.code()), (400, "bad_json"));
    let r = srv.post_raw("/api/v1/channels/chat:e/messages", br#"{"dta": 1}"#.to_vec(), &h).await;
    assert_eq!((r.status, r.code()), (400, "bad_request"));
    let big = serde_json::to_vec(&json!({ "data": "x".repeat(4096) })).unwrap();
    let r = srv.post_raw("/api/v1/channels/chat:e/messages", big, &h).await;
    assert_eq!((r.status, r.code()), (413, "payload_too_large"));
    let many_meta: serde_json::Map<String, serde_json::Value> =
        (0..20).map(|i| (format!("k{i}"), json!("v"))).collect();
    let r = srv.publish_with("chat:e", json!({ "data": 1, "meta": many_meta }), None, Some(API_KEY)).await;
    assert_eq!((r.status, r.code()), (400, "bad_request"));
    let r = srv.get("/api/v1/nothing-here").await;
    assert_eq!((r.status, r.code()), (404, "not_found"));
    assert!(srv.history("chat:e").await.is_empty(), "nothing rejected was stored");
}

#[tokio::test]
async fn history_pages_through_the_log() {
    let srv = TestServer::start().await;
    for i in 1..=25 {
        srv.publish_with(
            "chat:h",
            json!({ "data": { "i": i }, "meta": { "trace_id": format!("t{i}") } }),
            None,
            Some(API_KEY),
        )
        .await;
    }
    let r = srv.get("/api/v1/channels/chat:h/messages?after=10&limit=5").await;
    assert_eq!(r.status, 200);
    assert_eq!((r.body["first"].as_u64(), r.body["head"].as_u64()), (Some(1), Some(25)));
    let msgs = r.body["messages"].as_array().unwrap();
    assert_eq!(msgs.iter().map(|m| m["seq"].as_u64().unwrap()).collect::<Vec<_>>(), vec![11, 12, 13, 14, 15]);
    assert_eq!(msgs[0]["data"], json!({ "i": 11 }));
    assert_eq!(msgs[0]["meta"]["trace_id"], "t11");
    assert!(msgs[0]["id"].as_str().unwrap().len() == 36, "UUID");
    let all = srv.history("chat:h").await;
    assert_eq!(all.len(), 25);
    let ids: Vec<&str> = all.iter().map(|m| m["id"].as_str().unwrap()).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted, "UUIDv7 ids are time-ordered");
    let r = srv.get("/api/v1/channels/chat:h/messages?limit=0").await;
    assert_eq!((r.status, r.code()), (400, "bad_request"));
    let r = srv.get("/api/v1/channels/chat:h/messages?after=-1").await;
    assert_eq!((r.status, r.code()), (400, "bad_request"));
}

#[tokio::test]
async fn operations_endpoints() {
    let srv = TestServer::start().await;
    assert_eq!(srv.get("/healthz").await.status, 200);
    assert_eq!(srv.get("/readyz").await.status, 200);
    srv.publish("chat:m", json!(1)).await;
    let m = reqwest::get(format!("{}/metrics", srv.url)).await.unwrap().text().await.unwrap();
    for name in [
        "herald_connections",
        "herald_subscriptions",
        "herald_published_total 1",
        "herald_delivered_total",
        "herald_dedup_hits_total",
        "herald_slow_consumer_disconnects_total",
        "herald_publish_latency_seconds_bucket",
        // The engine's own figures.
        "herald_engine_appends_total 1",
        "herald_engine_fsyncs_total",
        "herald_engine_queue_depth 0",
    ] {
        assert!(m.contains(name), "missing {name} in:\n{m}");
    }
}
