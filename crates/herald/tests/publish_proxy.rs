//! The publish proxy: a real backend decides each client publish of an
//! opted-in namespace. A refusal reaches the client as `forbidden` with the
//! backend's message, a timeout fails closed (`unavailable`, nothing
//! appended), a replaced `data` is what subscribers get, and namespaces that
//! did not opt in never ask.

mod common;
mod webhook_backend;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{next_frame, TestServer};
use herald_server::proxies::{ProxiesConfig, ProxyConfig};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

const SECRET: &str = "proxy-test-secret-0123456789abcdef0123";

/// Answers by the published data: "refuse" → refusal, "slow" → no answer
/// within the timeout, "replace" → new data, "broken" → 500, else allow.
/// Records every question with whether its signature was valid.
async fn backend() -> (String, Arc<Mutex<Vec<(Value, bool)>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/publish", listener.local_addr().unwrap());
    let seen: Arc<Mutex<Vec<(Value, bool)>>> = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else { return };
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while let Some((head, body)) = webhook_backend::read_request(&mut s, &mut buf).await {
                    let sig = head
                        .lines()
                        .find_map(|l| l.strip_prefix("herald-signature: ").map(str::to_owned))
                        .unwrap_or_default();
                    let ok = webhook_backend::verify(SECRET.as_bytes(), sig.trim(), &body);
                    let q: Value = serde_json::from_slice(&body).unwrap();
                    log.lock().unwrap().push((q.clone(), ok));
                    let data = q["data"].to_string();
                    let (status, answer) = if data.contains("refuse") {
                        (200, json!({ "allow": false, "message": "not in this conversation" }))
                    } else if data.contains("slow") {
                        tokio::time::sleep(Duration::from_secs(3)).await;
                        (200, json!({ "allow": true }))
                    } else if data.contains("broken") {
                        (500, json!({}))
                    } else if data.contains("replace") {
                        (200, json!({ "allow": true, "data": { "text": "***", "by": q["user"] } }))
                    } else {
                        (200, json!({ "allow": true }))
                    };
                    let body = answer.to_string();
                    let resp = format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\n\r\n{body}", body.len());
                    if s.write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publish_proxy_allows_refuses_replaces_and_fails_closed() {
    let (url, seen) = backend().await;
    let srv = TestServer::start_with(|c| {
        c.proxies = ProxiesConfig {
            publish: Some(ProxyConfig {
                url,
                timeout: Duration::from_millis(300),
                namespaces: vec!["chat".into()],
                secret: SECRET.into(),
            }),
        };
    })
    .await;
    let mut sub = srv.connect("bob").await;
    sub.subscribe("chat:p", None).await.unwrap();
    let mut alice = srv.connect("alice").await;

    // Allowed as sent.
    alice.publish("chat:p", &json!({ "text": "hi" }), None).await.unwrap();
    // Refused: the backend's message reaches the client.
    let r = alice.publish("chat:p", &json!({ "text": "refuse me" }), None).await.unwrap();
    assert_eq!((r.kind.as_str(), r.code.as_ref().and_then(Value::as_str)), ("error", Some("forbidden")));
    assert_eq!(r.message.as_deref(), Some("not in this conversation"));
    // Timeout and a 500: fail closed.
    for d in ["slow", "broken"] {
        let r = alice.publish("chat:p", &json!({ "text": d }), None).await.unwrap();
        assert_eq!(
            (r.kind.as_str(), r.code.as_ref().and_then(Value::as_str)),
            ("error", Some("unavailable")),
            "{d}"
        );
    }
    // Replaced: subscribers get the backend's data.
    alice.publish("chat:p", &json!({ "text": "replace this" }), None).await.unwrap();

    let first = next_frame(&mut sub).await;
    assert_eq!(first.seq, Some(1));
    assert_eq!(
        serde_json::from_str::<Value>(first.data.as_ref().unwrap().get()).unwrap(),
        json!({ "text": "hi" })
    );
    let second = next_frame(&mut sub).await;
    assert_eq!(second.seq, Some(2), "refused and failed publishes appended nothing");
    assert_eq!(
        serde_json::from_str::<Value>(second.data.as_ref().unwrap().get()).unwrap(),
        json!({ "text": "***", "by": "alice" })
    );
    assert_eq!(srv.history("chat:p").await.len(), 2);

    // The backend saw signed questions with the user and the data.
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 5);
    assert!(seen.iter().all(|(q, ok)| *ok && q["user"] == "alice" && q["channel"] == "chat:p"));

    // A namespace that did not opt in never asks; HTTP API publishes (the
    // backend's own) never ask either.
    alice.publish("room-less:x", &json!("refuse"), None).await.ok();
    assert_eq!(srv.publish("chat:p", json!({ "text": "refuse via api" })).await.status, 201);
    assert_eq!(seen.len(), 5);
    srv.stop().await;
}
