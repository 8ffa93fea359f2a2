//! Ordered webhooks against a real test backend: every message of every
//! matching channel arrives, per channel in seq order, signed, while
//! clients publish over sockets and HTTP and the backend fails in every
//! way it can; an operator's skip moves past a poison message.

mod webhook_backend;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use herald_server::webhooks::WebhookConfig;
use herald_test_support::{assert_eventually, TestServer, API_KEY};
use serde_json::json;
use webhook_backend::{check_order, Backend, Mode};

const SECRET: &str = "webhook-test-secret-0123456789abcdef";

fn hook(url: &str) -> WebhookConfig {
    WebhookConfig {
        name: "backend".into(),
        url: url.into(),
        channels: vec!["chat:*".into()],
        secret: SECRET.into(),
        timeout: Duration::from_millis(500),
        max_messages_per_request: 7,
        max_backoff: Duration::from_millis(400),
        channel_lease_ttl: Duration::from_secs(2),
        poll_interval: Duration::from_millis(200),
        ..Default::default()
    }
}

async fn metrics(srv: &TestServer) -> String {
    reqwest::get(format!("{}/metrics", srv.url)).await.unwrap().text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_arrives_in_order_signed_through_backend_failures() {
    let backend = Backend::start(SECRET).await;
    let srv = TestServer::start_with(|c| c.webhooks.push(hook(&backend.url))).await;
    // Published data, byte for byte, per channel and seq.
    let published: Arc<std::sync::Mutex<HashMap<(String, u64), String>>> = Arc::default();

    // HTTP publisher: chat:a and chat:b, data with odd spacing.
    let http_pub = {
        let (url, published) = (srv.url.clone(), published.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            for i in 0..60u64 {
                let ch = if i % 2 == 0 { "chat:a" } else { "chat:b" };
                let data = format!("{{\"via\" : \"http\",  \"n\":{i}}}");
                let r = http
                    .post(format!("{url}/api/v1/channels/{ch}/messages"))
                    .bearer_auth(API_KEY)
                    .header("content-type", "application/json")
                    .body(format!("{{\"data\": {data}}}"))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status().as_u16(), 201);
                let body: serde_json::Value = r.json().await.unwrap();
                published.lock().unwrap().insert((ch.into(), body["seq"].as_u64().unwrap()), data);
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        })
    };
    // Socket publisher: chat:a and chat:c.
    let ws_pub = {
        let mut conn = srv.connect("alice").await;
        let published = published.clone();
        tokio::spawn(async move {
            for i in 0..60u64 {
                let ch = if i % 2 == 0 { "chat:a" } else { "chat:c" };
                let data = json!({ "via": "ws", "n": i });
                let m = conn.publish(ch, &data, None).await.expect("socket publish");
                published.lock().unwrap().insert((ch.into(), m.seq.unwrap()), data.to_string());
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        })
    };

    // Meanwhile the backend fails in every way, then recovers.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for (mode, ms) in [(Mode::Fail500, 400), (Mode::Hang, 1200), (Mode::Close, 300), (Mode::Slow, 600)] {
        backend.set(mode);
        if mode == Mode::Fail500 {
            assert_eventually("the status API shows the failing channels", || async {
                let r = srv.get("/api/v1/webhooks").await;
                r.body["webhooks"][0]["stalled"].as_u64().unwrap_or(0) > 0
                    && r.body["webhooks"][0]["channels"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|c| c["last_error"]["class"] == "status")
            })
            .await;
        }
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    backend.set(Mode::Ok);
    backend.refuse();
    tokio::time::sleep(Duration::from_millis(500)).await;
    backend.accept_again().await;
    http_pub.await.unwrap();
    ws_pub.await.unwrap();

    let heads: HashMap<&str, u64> = ["chat:a", "chat:b", "chat:c"]
        .into_iter()
        .map(|ch| {
            let n = published.lock().unwrap().keys().filter(|(c, _)| c == ch).count() as u64;
            (ch, n)
        })
        .collect();
    assert_eq!(heads["chat:a"], 60);
    assert_eventually("every message reached the backend", || async {
        heads.iter().all(|(ch, head)| backend.accepted(ch).last().and_then(|b| b.last()) == Some(head))
    })
    .await;

    for (ch, head) in &heads {
        // One node, no crash: each channel in order, no gap and no repeat.
        assert_eq!(check_order(ch, &backend.accepted(ch), true), *head);
    }
    let published = published.lock().unwrap().clone();
    backend.with_seen(|seen| {
        assert!(seen.iter().any(|r| !r.accepted), "the backend did fail");
        for r in seen {
            assert!(r.signature_ok, "valid signature on every request");
            assert_eq!(r.webhook_id, "backend");
            assert_eq!(r.content_type, "application/json");
            assert!(r.token > 0, "a fencing token");
            assert_eq!(r.body.webhook, "backend");
            assert!(r.body.messages.len() <= 7, "max_batch");
            for m in &r.body.messages {
                assert_eq!(m.kind, "message");
                assert!(!m.id.is_empty() && m.ts > 0);
                let want = &published[&(r.body.channel.clone(), m.seq)];
                assert_eq!(m.data.get(), want, "data byte for byte");
            }
        }
    });

    let text = metrics(&srv).await;
    for class in ["status", "timeout", "connect"] {
        assert!(
            text.contains(&format!("herald_webhook_failures_total{{webhook=\"backend\",class=\"{class}\"}}")),
            "failures of class {class} counted:\n{text}"
        );
    }
    assert!(text.contains("herald_webhook_delivered_total{webhook=\"backend\"} 120"), "{text}");
    let r = srv.get("/api/v1/webhooks").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["webhooks"][0]["lag"], 0, "{:?}", r.body);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_moves_past_a_poison_message_and_is_the_only_way_past_it() {
    let backend = Backend::start(SECRET).await;
    backend.poison(Some("poison"));
    let srv = TestServer::start_with(|c| {
        let mut h = hook(&backend.url);
        h.max_messages_per_request = 1;
        c.webhooks.push(h);
    })
    .await;
    for d in [json!("one"), json!("poison"), json!("three")] {
        assert_eq!(srv.publish("chat:p", d).await.status, 201);
    }
    assert_eventually("the poison message stalls the channel", || async {
        let r = srv.get("/api/v1/webhooks").await;
        let ch = &r.body["webhooks"][0]["channels"][0];
        ch["channel"] == "chat:p" && ch["stalled"] == true && ch["cursor"] == 1 && ch["lag"] == 2
    })
    .await;
    assert_eq!(backend.accepted("chat:p"), vec![vec![1]]);

    let r = srv.call("POST", "/api/v1/webhooks/backend/channels/chat:p/skip", None, &[]).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["skipped"], 2);
    assert_eventually("delivery resumes after the skipped message", || async {
        backend.accepted("chat:p") == vec![vec![1], vec![3]]
    })
    .await;
    let r = srv.call("POST", "/api/v1/webhooks/backend/channels/chat:p/retry", None, &[]).await;
    assert_eq!(r.status, 202);
    let r = srv.call("POST", "/api/v1/webhooks/nope/channels/chat:p/skip", None, &[]).await;
    assert_eq!(r.status, 404);
    let r = srv.call("POST", "/api/v1/webhooks/backend/channels/room:x/retry", None, &[]).await;
    assert_eq!(r.status, 404, "not a channel of this webhook");
    srv.stop().await;
}

#[tokio::test]
async fn no_client_can_take_a_webhooks_subscriber_id() {
    use herald_client::{ConnectOptions, Connection};
    use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
    let srv = TestServer::start_with(|c| c.dev = false).await;
    let exp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 300;
    let claims = json!({ "sub": "herald:webhook:backend", "exp": exp, "channels": ["*"] });
    let token = encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(herald_test_support::JWT_SECRET.as_bytes()),
    )
    .unwrap();
    let Err(err) = Connection::connect(&ConnectOptions::token(&srv.url, &token)).await else {
        panic!("a reserved sub must be refused")
    };
    assert_eq!(err.http_status(), Some(401));
    srv.stop().await;
    let dev = TestServer::start().await;
    let Err(err) = Connection::connect(&ConnectOptions::dev_user(&dev.url, "herald:webhook:backend")).await
    else {
        panic!("a reserved dev user must be refused")
    };
    assert_eq!(err.http_status(), Some(400));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_overtaking_a_stalled_webhook_is_reported() {
    let backend = Backend::start(SECRET).await;
    backend.set(Mode::Fail500);
    let srv = TestServer::start_with(|c| {
        c.namespaces
            .0
            .insert("short".into(), herald_core::NamespaceOptions { history_size: 5, ..Default::default() });
        let mut h = hook(&backend.url);
        h.channels = vec!["short:*".into()];
        c.webhooks.push(h);
    })
    .await;
    for i in 1..=12 {
        assert_eq!(srv.publish("short:x", json!(i)).await.status, 201);
    }
    // The backend refuses; retention keeps the last 5 of 12.
    assert_eventually("the status API reports the overtaken messages", || async {
        let r = srv.get("/api/v1/webhooks").await;
        let ch = &r.body["webhooks"][0]["channels"][0];
        ch["channel"] == "short:x" && ch["overtaken"] == 7 && ch["stalled"] == true && ch["lag"] == 12
    })
    .await;
    backend.set(Mode::Ok);
    assert_eventually("the retained messages are delivered", || async {
        backend.accepted("short:x").iter().flatten().max() == Some(&12)
    })
    .await;
    let got: Vec<u64> = backend.accepted("short:x").into_iter().flatten().collect();
    assert_eq!(got, (8..=12).collect::<Vec<_>>());
    let text = metrics(&srv).await;
    assert!(text.contains("herald_webhook_overtaken_messages_total{webhook=\"backend\"} 7"), "{text}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_are_delivered_in_parallel_up_to_max_parallel() {
    let backend = Backend::start(SECRET).await;
    backend.set(Mode::Slow);
    let srv = TestServer::start_with(|c| {
        let mut h = hook(&backend.url);
        h.max_parallel = 2;
        c.webhooks.push(h);
    })
    .await;
    let channels: Vec<String> = (0..8).map(|i| format!("chat:par{i}")).collect();
    for round in 0..3 {
        for ch in &channels {
            assert_eq!(srv.publish(ch, json!(round)).await.status, 201);
        }
    }
    assert_eventually("every channel delivered", || async {
        channels.iter().all(|ch| backend.accepted(ch).iter().flatten().max() == Some(&3))
    })
    .await;
    for ch in &channels {
        check_order(ch, &backend.accepted(ch), true);
    }
    let max = backend.max_in_flight.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(max, 2, "two channels at once, never more");
    srv.stop().await;
}
