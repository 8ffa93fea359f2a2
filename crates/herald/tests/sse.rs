//! Server-Sent Events (`GET /sse`) through real sockets: events carry the
//! stored frame and ids naming every channel's position; `Last-Event-ID`
//! resumes one or several channels exactly after what was seen; forged,
//! oversized and mismatched ids are refused with a problem document;
//! truncation and epoch change are named events; the same auth, namespace
//! and Origin rules as a WebSocket; a slow reader is closed and resumes with
//! nothing lost; pings are comments; drain ends the stream with a
//! `disconnect` event; HTTP/2 streams too.

use std::collections::BTreeMap;
use std::time::Duration;

use herald_test_support::*;
use serde_json::{json, Value};

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

fn url(srv: &TestServer, query: &str) -> String {
    format!("{}/sse?{query}", srv.url)
}

async fn open(srv: &TestServer, query: &str, last: Option<&str>) -> SseStream {
    SseStream::open(&client(), &url(srv, query), last).await.stream()
}

async fn publish_n(srv: &TestServer, channel: &str, from: u64, to: u64) {
    for n in from..=to {
        assert_eq!(srv.publish(channel, json!({ "n": n })).await.status, 201);
    }
}

/// The `(channel, seq)` of app messages.
fn positions(msgs: &[Value]) -> Vec<(String, u64)> {
    msgs.iter().map(|m| (m["channel"].as_str().unwrap().to_owned(), m["seq"].as_u64().unwrap())).collect()
}

#[tokio::test]
async fn one_channel_resumes_exactly_after_the_last_event_id() {
    let srv = TestServer::start().await;
    publish_n(&srv, "chat:one", 1, 3).await;
    let mut s = open(&srv, "channel=chat:one&user=ann&from=first", None).await;
    assert_eq!(s.headers["content-type"], "text/event-stream");
    let opened = s.next().await.unwrap();
    assert_eq!(opened.event.as_deref(), Some("subscribed"));
    assert_eq!(opened.json()["channel"], "chat:one");
    let epoch = opened.json()["epoch"].as_str().unwrap().to_owned();
    assert_eq!(opened.id, Some(format!("{epoch}:0")), "the opening names where delivery starts");
    let first = s.messages(3).await;
    assert_eq!(positions(&first), [("chat:one".into(), 1), ("chat:one".into(), 2), ("chat:one".into(), 3)]);
    assert_eq!(first[1]["data"], json!({ "n": 2 }), "the stored frame, data and all");
    assert_eq!(s.last_id, Some(format!("{epoch}:3")));
    assert_eq!(s.retry_ms, Some(2000), "retry: from sse.retry");
    let last = s.last_id.clone();
    drop(s);

    publish_n(&srv, "chat:one", 4, 6).await;
    let mut s = open(&srv, "channel=chat:one&user=ann", last.as_deref()).await;
    let reopened = s.next().await.unwrap();
    assert_eq!(reopened.json()["truncated"], false);
    let rest = s.messages(3).await;
    assert_eq!(rest.iter().map(|m| m["seq"].as_u64().unwrap()).collect::<Vec<_>>(), [4, 5, 6]);
    publish_n(&srv, "chat:one", 7, 7).await;
    assert_eq!(s.messages(1).await[0]["seq"], 7, "live after the catch-up");
    assert!(s.next_within(Duration::from_millis(300)).await.is_err(), "nothing more: no duplicate");
}

#[tokio::test]
async fn several_channels_resume_each_from_its_own_position() {
    let srv = TestServer::start().await;
    let query = "channel=chat:a&channel=live:v&channel=chat:b&user=bo";
    let mut s = open(&srv, query, None).await;
    for _ in 0..3 {
        assert_eq!(s.next().await.unwrap().event.as_deref(), Some("subscribed"));
    }
    publish_n(&srv, "chat:a", 1, 2).await;
    assert_eq!(srv.publish("live:v", json!("volatile")).await.status, 202);
    publish_n(&srv, "chat:b", 1, 1).await;
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let ev = s.next().await.unwrap();
        if ev.is_message() {
            if ev.json()["channel"] == "live:v" {
                assert_eq!(ev.id, None, "a volatile message moves no position");
            }
            seen.push(ev.json());
        }
    }
    let id = s.last_id.clone().unwrap();
    let entries: Vec<&str> = id.split(',').collect();
    assert_eq!(entries.len(), 3, "one position per channel, in query order: {id}");
    assert!(entries[0].ends_with(":2") && entries[1].is_empty() && entries[2].ends_with(":1"), "{id}");
    drop(s);

    publish_n(&srv, "chat:a", 3, 4).await;
    publish_n(&srv, "chat:b", 2, 3).await;
    let mut s = open(&srv, query, Some(&id)).await;
    let msgs = s.messages(4).await;
    let mut per: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (c, seq) in positions(&msgs) {
        per.entry(c).or_default().push(seq);
    }
    assert_eq!(per["chat:a"], [3, 4]);
    assert_eq!(per["chat:b"], [2, 3]);
    assert!(s.next_within(Duration::from_millis(300)).await.is_err(), "nothing more: no duplicate");
}

#[tokio::test]
async fn a_forged_oversized_or_mismatched_id_is_refused_with_a_problem() {
    let srv = TestServer::start().await;
    publish_n(&srv, "chat:f", 1, 1).await;
    let epoch = srv.publish("chat:f", json!(2)).await.body["epoch"].as_str().unwrap().to_owned();
    let refused = |last: String| {
        let srv = &srv;
        async move {
            SseStream::open(&client(), &url(srv, "channel=chat:f&user=eve"), Some(&last)).await.refused()
        }
    };
    let (status, body) = refused(format!("{epoch}:99")).await;
    assert_eq!((status, body["code"].as_str()), (400, Some("bad_request")), "past the head: {body}");
    // Another epoch is not refused: the log was reset (`epoch_changed`).
    let (status, body) = refused("E:1,E:2".into()).await;
    assert_eq!(status, 400);
    assert!(body["detail"].as_str().unwrap().contains("2 position(s)"), "{body}");
    let (status, _) = refused("not a position".into()).await;
    assert_eq!(status, 400);
    let (status, body) = refused(format!("{}:1", "e".repeat(4096))).await;
    assert_eq!(status, 400);
    assert!(body["detail"].as_str().unwrap().contains("longer than"), "{body}");
    let (status, _) =
        SseStream::open(&client(), &url(&srv, "channel=chat:f&user=eve&since=x:y"), None).await.refused();
    assert_eq!(status, 400, "`since` is checked the same way");
}

#[tokio::test]
async fn truncation_and_epoch_change_are_named_events() {
    let srv = TestServer::start_with(|c| {
        c.namespaces.0.insert(
            "short".into(),
            herald_core::NamespaceOptions { history_size: 5, client_publish: true, ..Default::default() },
        );
    })
    .await;
    publish_n(&srv, "short:t", 1, 12).await;
    let mut s = open(&srv, "channel=short:t&user=tom", None).await;
    let epoch = s.next().await.unwrap().json()["epoch"].as_str().unwrap().to_owned();
    drop(s);

    let mut s = open(&srv, "channel=short:t&user=tom", Some(&format!("{epoch}:2"))).await;
    assert_eq!(s.next().await.unwrap().event.as_deref(), Some("subscribed"));
    let t = s.next().await.unwrap();
    assert_eq!(t.event.as_deref(), Some("truncated"));
    assert_eq!(t.json()["first"], 8);
    let msgs = s.messages(5).await;
    assert_eq!(msgs.iter().map(|m| m["seq"].as_u64().unwrap()).collect::<Vec<_>>(), [8, 9, 10, 11, 12]);
    drop(s);

    let mut s = open(&srv, "channel=short:t&user=tom", Some("another-epoch:11")).await;
    assert_eq!(s.next().await.unwrap().event.as_deref(), Some("subscribed"));
    let changed = s.next().await.unwrap();
    assert_eq!(changed.event.as_deref(), Some("epoch_changed"));
    assert_eq!(changed.json()["epoch"], epoch.as_str());
    assert!(changed.id.unwrap().starts_with(&format!("{epoch}:")), "the id takes the log's epoch");
    assert_eq!(s.messages(1).await[0]["seq"], 8, "from the first retained message");
}

#[tokio::test]
async fn the_websocket_rules_apply_tokens_namespaces_and_origins() {
    let srv = TestServer::start_with(|c| {
        c.dev = false;
        c.allowed_origins = vec!["https://app.example.com".into()];
    })
    .await;
    let c = client();
    let (status, body) = SseStream::open(&c, &url(&srv, "channel=chat:x"), None).await.refused();
    assert_eq!((status, body["code"].as_str()), (401, Some("unauthorized")));
    let (status, _) = SseStream::open(&c, &url(&srv, "channel=chat:x&user=dev"), None).await.refused();
    assert_eq!(status, 403, "no dev users outside dev mode");
    let token = user_token("ann", &["chat:x"], 600);
    let (status, body) =
        SseStream::open(&c, &url(&srv, &format!("channel=chat:other&token={token}")), None).await.refused();
    assert_eq!((status, body["code"].as_str()), (403, Some("forbidden")), "{body}");
    let (status, body) =
        SseStream::open(&c, &url(&srv, &format!("channel=nope:x&token={token}")), None).await.refused();
    assert_eq!((status, body["code"].as_str()), (404, Some("unknown_namespace")), "{body}");
    let r = c
        .get(url(&srv, &format!("channel=chat:x&token={token}")))
        .header("Origin", "https://evil.example.com")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403, "a page of another site is refused");

    // The token in the Authorization header; an allowed page may read it.
    let r = c
        .get(url(&srv, "channel=chat:x"))
        .bearer_auth(&token)
        .header("Origin", "https://app.example.com")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["access-control-allow-origin"], "https://app.example.com");
    let metrics = srv.get("/metrics").await.body;
    assert!(
        metrics.as_str().unwrap().contains(r#"herald_protocol_connections{protocol="sse"} 1"#),
        "counted as a connection: {metrics}"
    );
}

#[tokio::test]
async fn a_slow_reader_is_closed_and_resumes_with_nothing_lost() {
    let srv = TestServer::start_with(|c| {
        c.websocket.outbox_capacity = 16;
        c.websocket.outbox_bytes = 256 * 1024;
        c.websocket.max_message_bytes = 64 * 1024;
    })
    .await;
    let mut s = open(&srv, "channel=chat:slow&user=sam", None).await;
    assert_eq!(s.next().await.unwrap().event.as_deref(), Some("subscribed"));
    // The reader reads nothing while far more than the socket buffers and
    // the session's bounds hold is published.
    const N: u64 = 400;
    let blob = "x".repeat(48 * 1024);
    for n in 1..=N {
        let r = srv.publish("chat:slow", json!({ "n": n, "blob": blob })).await;
        assert_eq!(r.status, 201);
    }
    let mut seqs = Vec::new();
    let mut disconnect = None;
    for ev in s.until_end().await {
        match ev.event.as_deref() {
            None => seqs.push(ev.json()["seq"].as_u64().unwrap()),
            Some("disconnect") => disconnect = Some(ev.json()),
            Some(_) => {}
        }
    }
    assert!(seqs.len() < N as usize, "the reader fell behind and was closed");
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "in order, no gap before the close");
    // The last event says why when the reader reads again within the
    // close's bound; either way the server closed it as a slow consumer.
    if let Some(d) = disconnect {
        assert_eq!((d["code"].as_u64(), d["reconnect"].as_bool()), (Some(4008), Some(true)), "{d}");
    }
    let metrics = srv.get("/metrics").await.body;
    assert!(
        metrics.as_str().unwrap().contains(r#"herald_closes_total{reason="slow_consumer"} 1"#),
        "{metrics}"
    );

    let mut s = open(&srv, "channel=chat:slow&user=sam", s.last_id.as_deref()).await;
    let rest = s.messages(N as usize - seqs.len()).await;
    let mut all = seqs.clone();
    all.extend(rest.iter().map(|m| m["seq"].as_u64().unwrap()));
    assert_eq!(all, (1..=N).collect::<Vec<_>>(), "every message once, in order");
}

#[tokio::test]
async fn pings_are_comments_and_a_drain_ends_the_stream_with_a_disconnect() {
    let srv = TestServer::start_with(|c| {
        c.heartbeat.ping_interval = Duration::from_millis(100);
        c.heartbeat.idle_timeout = Duration::from_millis(300);
        c.shutdown.drain_period = Duration::from_millis(200);
    })
    .await;
    let mut s = open(&srv, "channel=chat:d&user=dan", None).await;
    assert_eq!(s.next().await.unwrap().event.as_deref(), Some("subscribed"));
    // Longer than the idle timeout: a reader that sends nothing stays.
    assert!(s.next_within(Duration::from_millis(800)).await.is_err(), "no event, but still open");
    assert!(s.comments >= 3, "pings as comments: {}", s.comments);

    assert_eq!(srv.call("POST", "/api/v1/admin/drain", None, &[]).await.status, 202);
    let events = s.until_end().await;
    let last = events.last().expect("a last event");
    assert_eq!(last.event.as_deref(), Some("disconnect"));
    assert_eq!(last.json()["code"], 4010);
    let (status, _) = SseStream::open(&client(), &url(&srv, "channel=chat:d&user=dan"), None).await.refused();
    assert_eq!(status, 503, "a draining node takes no new stream");
}

#[tokio::test]
async fn a_stream_over_http2_with_prior_knowledge() {
    let srv = TestServer::start().await;
    let h2 = reqwest::Client::builder().http2_prior_knowledge().build().unwrap();
    let mut s = SseStream::open(&h2, &url(&srv, "channel=chat:h2s&user=hu"), None).await.stream();
    assert_eq!(s.version, reqwest::Version::HTTP_2);
    assert_eq!(s.next().await.unwrap().event.as_deref(), Some("subscribed"));
    publish_n(&srv, "chat:h2s", 1, 3).await;
    let msgs = s.messages(3).await;
    assert_eq!(msgs.iter().map(|m| m["seq"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2, 3]);
    // Other requests share the connection meanwhile.
    let r = h2.get(format!("{}/healthz", srv.url)).send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.version()), (200, reqwest::Version::HTTP_2));
}

#[tokio::test]
async fn acked_channels_are_read_only_the_cursor_does_not_move() {
    let srv = TestServer::start().await;
    publish_n(&srv, "user:ack", 1, 3).await;
    let query = "channel=user:ack&user=ack&device=d1";
    let mut s = open(&srv, query, None).await;
    let opened = s.next().await.unwrap().json();
    assert_eq!((opened["cursor"].as_u64(), opened["unread"].as_u64()), (Some(0), Some(3)), "{opened}");
    assert_eq!(s.messages(3).await.len(), 3, "the inbox, from the stored cursor");
    let last = s.last_id.clone();
    drop(s);
    // A resume names a position but acknowledges nothing.
    let mut s = open(&srv, query, last.as_deref()).await;
    let reopened = s.next().await.unwrap().json();
    assert_eq!(reopened["cursor"], 0, "{reopened}");
    let inbox = srv.get("/api/v1/users/ack/inbox").await.body;
    let channel = inbox["channels"].as_array().unwrap().iter().find(|c| c["channel"] == "user:ack").cloned();
    let devices = channel.map(|c| c["devices"].clone()).unwrap_or(json!([]));
    assert_eq!(devices, json!([]), "no cursor was stored: {inbox}");
}

#[tokio::test]
async fn streams_count_under_the_session_cap_not_the_http_one() {
    let srv = TestServer::start_with(|c| {
        c.http.max_connections = 16;
        c.websocket.max_connections = 24;
    })
    .await;
    let mut streams = Vec::new();
    for i in 0..24 {
        let mut s = open(&srv, &format!("channel=chat:cap&user=u{i}"), None).await;
        assert_eq!(s.next().await.unwrap().event.as_deref(), Some("subscribed"));
        streams.push(s);
    }
    // More streams than HTTP places, and the API still answers.
    assert_eq!(srv.publish("chat:cap", json!("all")).await.status, 201);
    for s in &mut streams {
        assert_eq!(s.messages(1).await[0]["data"], "all");
    }
    let (status, body) =
        SseStream::open(&client(), &url(&srv, "channel=chat:cap&user=late"), None).await.refused();
    assert_eq!((status, body["code"].as_str()), (503, Some("too_many_connections")), "{body}");
}
