//! Backend proxies against a real backend. Publish: a refusal reaches the
//! client as `forbidden` with the backend's message, a timeout fails closed
//! (`unavailable`, nothing appended), a replaced `data` is what subscribers
//! get, and namespaces that did not opt in never ask. Subscribe: allow,
//! refuse, cached answers, failures fail closed and are not cached.
//! Connect: the backend's grant is the connection's identity and
//! permissions; a refusal is the HTTP status before the upgrade; a timeout
//! is 503.

mod webhook_backend;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_server::proxies::{ProxiesConfig, ProxyConfig};
use herald_test_support::{next_frame, TestServer};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

const SECRET: &str = "proxy-test-secret-0123456789abcdef0123";

/// Answers by the published data (or, for a subscribe question, the
/// channel name): "refuse" → refusal, "slow" → no answer
/// within the timeout, "hold" → allow after 300 ms, "replace" → new data,
/// "broken" → 500, else allow.
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
                    let data = if q.get("data").is_some() {
                        q["data"].to_string()
                    } else if q.get("headers").is_some() {
                        q["headers"]["cookie"].to_string()
                    } else {
                        q["channel"].to_string()
                    };
                    let (status, answer) = if data.contains("session=good") {
                        (
                            200,
                            json!({ "allow": true, "user": "dave", "device": "phone", "channels": ["chat:*", "chat:dave-feed"],
                                    "publish": ["chat:room1"], "expires_in": 3600 }),
                        )
                    } else if data.contains("session=forbid") {
                        (200, json!({ "allow": false, "status": 403, "message": "account suspended" }))
                    } else if data.contains("refuse") {
                        (200, json!({ "allow": false, "message": "not in this conversation" }))
                    } else if data.contains("slow") {
                        tokio::time::sleep(Duration::from_secs(3)).await;
                        (200, json!({ "allow": true }))
                    } else if data.contains("hold") {
                        tokio::time::sleep(Duration::from_millis(300)).await;
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
                ..Default::default()
            }),
            ..Default::default()
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

/// The peer's close frame arrives while one batch of its publishes is with
/// the engine (held here by the publish proxy) and more are queued behind
/// it: every publish sent before the close is appended, in frame order,
/// though the replies can no longer be written (the socket takes no frames
/// after the peer's close).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_queued_behind_a_batch_in_flight_are_appended_when_the_peer_closes() {
    let (url, seen) = backend().await;
    let srv = TestServer::start_with(|c| {
        c.rate_limits.client_frames_per_sec = 1_000_000;
        c.proxies = ProxiesConfig {
            publish: Some(ProxyConfig {
                url,
                timeout: Duration::from_secs(5),
                namespaces: vec!["chat".into()],
                secret: SECRET.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
    })
    .await;
    let mut alice = srv.connect("alice").await;
    let publish = |i: u64, text: &str| json!({ "type": "publish", "req": i + 1, "channel": "chat:held", "data": { "i": i, "text": text } });
    alice.send(&publish(0, "hold")).await.unwrap();
    // The first batch is with the backend (for 300 ms) before the rest is sent.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while seen.lock().unwrap().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the publish proxy was never asked");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    const N: u64 = 50;
    for i in 1..N {
        alice.send(&publish(i, "queued")).await.unwrap();
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), alice.close(Some(1000), "done"))
        .await
        .expect("closed in time");
    let mut got = Vec::new();
    for _ in 0..200 {
        got = srv.history("chat:held").await.iter().map(|m| m["data"]["i"].as_u64().unwrap()).collect();
        if got.len() as u64 == N {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(got, (0..N).collect::<Vec<_>>(), "every publish before the close, once, in frame order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subscribe_proxy_allows_refuses_caches_and_fails_closed() {
    let (url, seen) = backend().await;
    let srv = TestServer::start_with(|c| {
        c.proxies.subscribe = Some(ProxyConfig {
            url,
            timeout: Duration::from_millis(300),
            namespaces: vec!["chat".into()],
            secret: SECRET.into(),
            cache: Duration::from_secs(60),
            ..Default::default()
        });
    })
    .await;
    let mut c = srv.connect("carol").await;
    let code = |r: &herald_proto::MessageView| {
        (r.kind.clone(), r.code.as_ref().and_then(Value::as_str).map(str::to_owned))
    };
    let ok = c.subscribe("chat:open", None).await.unwrap();
    assert_eq!(ok.kind, "ok");
    let r = c.subscribe("chat:refuse", None).await.unwrap();
    assert_eq!(code(&r), ("error".into(), Some("forbidden".into())));
    assert_eq!(r.message.as_deref(), Some("not in this conversation"));
    for ch in ["chat:slow", "chat:broken"] {
        let r = c.subscribe(ch, None).await.unwrap();
        assert_eq!(code(&r), ("error".into(), Some("unavailable".into())), "{ch}");
    }
    let asked = seen.lock().unwrap().len();
    assert_eq!(asked, 4);
    // Cached: the same answers again without asking; failures are not cached.
    let r = c.subscribe("chat:refuse", None).await.unwrap();
    assert_eq!(code(&r), ("error".into(), Some("forbidden".into())));
    c.unsubscribe("chat:open").await.unwrap();
    assert_eq!(c.subscribe("chat:open", None).await.unwrap().kind, "ok");
    assert_eq!(seen.lock().unwrap().len(), asked);
    let r = c.subscribe("chat:broken", None).await.unwrap();
    assert_eq!(code(&r), ("error".into(), Some("unavailable".into())));
    assert_eq!(seen.lock().unwrap().len(), asked + 1);
    // Another namespace does not ask.
    assert_eq!(c.subscribe("user:carol", None).await.unwrap().kind, "ok");
    assert_eq!(seen.lock().unwrap().len(), asked + 1);
    assert!(seen.lock().unwrap().iter().all(|(q, ok)| *ok && q["user"] == "carol"));
    let text = reqwest::get(format!("{}/metrics", srv.url)).await.unwrap().text().await.unwrap();
    for (outcome, n) in [("allow", 1), ("refuse", 1), ("fail", 3), ("cached", 2)] {
        let line = format!("herald_proxy_requests_total{{proxy=\"subscribe\",outcome=\"{outcome}\"}} {n}");
        assert!(text.contains(&line), "{line}\n{text}");
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connect_proxy_grants_identity_or_refuses_before_the_upgrade() {
    use futures_util::{SinkExt, StreamExt};
    let (srv, seen) = with_connect_proxy().await;
    let ws_url = format!("ws://{}/ws", srv.addr);
    let dial = |cookie| {
        let ws_url = ws_url.clone();
        async move { dial_with_cookie(&ws_url, cookie).await }
    };
    // Granted: the backend's user and permissions.
    let (mut ws, _) = dial("session=good").await.expect("granted");
    let mut req = 0;
    let mut ask = |frame: Value| {
        req += 1;
        let mut frame = frame;
        frame["req"] = json!(req);
        (frame, req)
    };
    for (frame, want) in [
        (json!({ "type": "subscribe", "channel": "chat:any" }), "ok"),
        (json!({ "type": "subscribe", "channel": "news:x" }), "error"),
        (json!({ "type": "publish", "channel": "chat:room1", "data": "hi" }), "ok"),
        (json!({ "type": "publish", "channel": "chat:room2", "data": "hi" }), "error"),
    ] {
        let (frame, id) = ask(frame);
        ws.send(tokio_websockets::Message::text(frame.to_string())).await.unwrap();
        let reply = loop {
            let m = tokio::time::timeout(Duration::from_secs(10), ws.next()).await.unwrap().unwrap().unwrap();
            let Some(text) = m.as_text() else { continue };
            let v: Value = serde_json::from_str(text).unwrap();
            if v["req"] == json!(id) {
                break v;
            }
        };
        assert_eq!(reply["type"], want, "{frame} -> {reply}");
    }
    assert_eq!(srv.history("chat:room1").await.len(), 1);
    // Refusals are the HTTP status before the upgrade; a timeout is 503.
    for (cookie, status) in [("session=refuse", 401u16), ("session=forbid", 403), ("session=slow", 503)] {
        match dial(cookie).await {
            Err(tokio_websockets::Error::Upgrade(e)) => {
                assert!(e.to_string().contains(&status.to_string()), "{cookie}: {e}")
            }
            other => panic!("{cookie} must be refused with {status}: {:?}", other.map(|_| ())),
        }
    }
    let questions = seen.lock().unwrap().clone();
    assert!(questions.iter().all(|(q, ok)| *ok && q["headers"]["cookie"].is_string()));
    srv.stop().await;
}

/// The Centrifugo endpoint: a `connect` without token is the connect
/// proxy's to decide, with the upgrade's headers; a refusal stops the SDK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connect_proxy_decides_a_centrifugo_connect_without_token() {
    use futures_util::SinkExt;
    let (srv, _seen) = with_connect_proxy().await;
    let ws_url = format!("ws://{}/connection/websocket", srv.addr);
    let dial = |cookie| {
        let ws_url = ws_url.clone();
        async move { dial_with_cookie(&ws_url, cookie).await.expect("upgrade").0 }
    };
    let mut ws = dial("session=good").await;
    let cmds = [
        json!({ "id": 1, "connect": {} }),
        json!({ "id": 2, "subscribe": { "channel": "chat:any" } }),
        json!({ "id": 3, "publish": { "channel": "chat:room2", "data": "hi" } }),
    ];
    let frame = cmds.iter().map(Value::to_string).collect::<Vec<_>>().join("\n");
    ws.send(tokio_websockets::Message::text(frame)).await.unwrap();
    let mut replies = Vec::new();
    while replies.len() < 3 {
        let m = next_message(&mut ws).await;
        let Some(text) = m.as_text() else { continue };
        replies.extend(text.split('\n').map(|l| serde_json::from_str::<Value>(l).unwrap()));
    }
    assert!(replies[0]["connect"].is_object(), "{}", replies[0]);
    // The grant's channel name is a server-side subscription, its pattern
    // a permission.
    let subs = replies[0]["connect"]["subs"].as_object().expect("server-side subscriptions");
    assert_eq!(subs.keys().collect::<Vec<_>>(), ["chat:dave-feed"], "{}", replies[0]);
    assert!(replies[1]["subscribe"].is_object(), "{}", replies[1]);
    // The grant's publish patterns hold: chat:room1 only.
    assert_eq!(replies[2]["error"]["code"], 103, "{}", replies[2]);
    let mut ws = dial("session=forbid").await;
    ws.send(tokio_websockets::Message::text(json!({ "id": 1, "connect": {} }).to_string())).await.unwrap();
    let close = loop {
        let m = next_message(&mut ws).await;
        if m.is_close() {
            break m.as_close().map(|(c, _)| u16::from(c));
        }
    };
    assert_eq!(close, Some(3500));
    srv.stop().await;
}

/// A server (not in dev mode) whose connect proxy is `backend()`.
async fn with_connect_proxy() -> (TestServer, Arc<Mutex<Vec<(Value, bool)>>>) {
    let (url, seen) = backend().await;
    let srv = TestServer::start_with(|c| {
        c.dev = false;
        c.proxies.connect = Some(ProxyConfig {
            url,
            timeout: Duration::from_millis(300),
            secret: SECRET.into(),
            ..Default::default()
        });
    })
    .await;
    (srv, seen)
}

type ClientSocket =
    tokio_websockets::WebSocketStream<tokio_websockets::MaybeTlsStream<tokio::net::TcpStream>>;

/// A WebSocket upgrade with a `Cookie` header (what the connect proxy sees).
async fn dial_with_cookie(
    url: &str,
    cookie: &'static str,
) -> Result<(ClientSocket, tokio_websockets::upgrade::Response), tokio_websockets::Error> {
    tokio_websockets::ClientBuilder::new()
        .uri(url)
        .unwrap()
        .add_header(http_header("cookie"), http::HeaderValue::from_static(cookie))
        .unwrap()
        .connect()
        .await
}

async fn next_message(ws: &mut ClientSocket) -> tokio_websockets::Message {
    use futures_util::StreamExt;
    tokio::time::timeout(Duration::from_secs(10), ws.next()).await.unwrap().unwrap().unwrap()
}

fn http_header(name: &'static str) -> http::HeaderName {
    http::HeaderName::from_static(name)
}
