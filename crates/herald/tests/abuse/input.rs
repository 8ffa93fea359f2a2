//! Hostile input: `data` that could break a channel's history if it were
//! stored unchecked (deep nesting, lone surrogates), one `Idempotency-Key`
//! sent to both publish endpoints, and identity fields with control
//! characters.

use std::collections::BTreeMap;
use std::time::Duration;

use herald_client::{ConnectOptions, Connection};
use herald_core::{Delivery, NamespaceOptions};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use herald_test_support::*;

fn nested(n: usize) -> String {
    "[".repeat(n) + &"]".repeat(n)
}

/// `data` as publishers send it, each to come back exactly as written: key
/// order, number spelling, whitespace inside, escapes, duplicate keys, and
/// the deepest nesting the default limit (64) allows.
fn kept() -> Vec<String> {
    let mut v: Vec<String> = [
        r#"{"b":1,"a":2,"c":{"z":0,"y":[]}}"#,
        "123456789012345678901234567890",
        "1e400",
        "-0.10000000000000000000000000001",
        "{ \"spaced\" : [ 1 , 2.50 ] ,\n  \"nl\" : true }",
        r#""\u00e9\/\n\ud83d\ude00 \u0000 é""#,
        r#"{"dup":1,"dup":2}"#,
        "null",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push(nested(64));
    v
}

/// `data` the publish rules refuse (`bad_data`): lone surrogates, nesting
/// past `publish.max_data_depth`.
fn refused() -> Vec<String> {
    let mut v: Vec<String> = [r#""\ud800""#, r#""\udc00""#, r#"["x","\ud800\u0041"]"#, r#"{"k\udfff":1}"#]
        .map(String::from)
        .to_vec();
    v.push(nested(65));
    v.push(nested(5000));
    v
}

/// A raw HTTP exchange: status and the body exactly as sent.
async fn raw(
    method: &str,
    srv: &TestServer,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut req = reqwest::Client::new().request(method, format!("{}{path}", srv.url)).bearer_auth(API_KEY);
    if let Some(b) = body {
        req = req.header("content-type", "application/json").body(b.to_owned());
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("the server answers (no dropped connection)");
    (resp.status().as_u16(), resp.text().await.unwrap())
}

#[derive(Deserialize)]
struct HistoryPage<'a> {
    #[serde(borrow)]
    messages: Vec<HistoryMessage<'a>>,
}

#[derive(Deserialize)]
struct HistoryMessage<'a> {
    #[serde(rename = "type")]
    kind: String,
    seq: u64,
    #[serde(borrow)]
    data: &'a RawValue,
}

/// `(type, seq, data text)` of every message in the channel's history,
/// read from the response bytes without going through a JSON value.
async fn history_raw(srv: &TestServer, channel: &str) -> Vec<(String, u64, String)> {
    let (status, body) =
        raw("GET", srv, &format!("/api/v1/channels/{channel}/messages?limit=1000"), None, &[]).await;
    assert_eq!(status, 200, "{body}");
    let page: HistoryPage<'_> = serde_json::from_str(&body).expect("a history page");
    page.messages.iter().map(|m| (m.kind.clone(), m.seq, m.data.get().to_owned())).collect()
}

async fn publish_http(srv: &TestServer, channel: &str, data: &str) -> (u16, String) {
    // Whitespace around `data` is not part of it.
    raw(
        "POST",
        srv,
        &format!("/api/v1/channels/{channel}/messages"),
        Some(&format!("{{\"data\":  {data}\n}}")),
        &[],
    )
    .await
}

async fn publish_socket(c: &mut Connection, channel: &str, data: &str) -> herald_proto::MessageView {
    let req = c.next_req();
    c.send_raw(&format!(r#"{{"type":"publish","req":{req},"channel":"{channel}","data":{data}}}"#))
        .await
        .unwrap();
    tokio::time::timeout(WAIT, c.reply(req)).await.expect("reply in time").unwrap()
}

fn data_of(f: &herald_proto::MessageView) -> String {
    f.data.as_ref().expect("a frame with data").get().to_owned()
}

#[tokio::test]
async fn published_data_comes_back_byte_for_byte_from_history_live_and_catch_up() {
    let srv = TestServer::start().await;
    let values = kept();
    let mut live = srv.connect("watcher").await;
    let ok = live.subscribe("chat:kept", None).await.unwrap();
    assert_eq!(ok.kind, "ok");
    let epoch = ok.epoch.clone().unwrap();
    live.subscribe("chat:kept-ws", None).await.unwrap();

    // Over HTTP, one by one and as a batch; over the socket.
    let mut publisher = srv.connect("publisher").await;
    for v in &values {
        let (status, body) = publish_http(&srv, "chat:kept", v).await;
        assert_eq!(status, 201, "{v}: {body}");
        let reply = publish_socket(&mut publisher, "chat:kept-ws", v).await;
        assert_eq!(reply.kind, "ok", "{v}: {reply:?}");
        let batch = format!(r#"{{"channels":["chat:kept-b1","chat:kept-b2"],"data":{v}}}"#);
        let (status, body) = raw("POST", &srv, "/api/v1/publish", Some(&batch), &[]).await;
        assert_eq!(status, 201, "{v}: {body}");
    }

    for channel in ["chat:kept", "chat:kept-ws", "chat:kept-b1", "chat:kept-b2"] {
        let history: Vec<String> = history_raw(&srv, channel).await.into_iter().map(|(_, _, d)| d).collect();
        assert_eq!(history, values, "history of {channel}");
    }
    let (mut got_http, mut got_ws) = (Vec::new(), Vec::new());
    for f in next_messages(&mut live, 2 * values.len()).await {
        match f.channel.as_deref() {
            Some("chat:kept") => got_http.push(data_of(&f)),
            _ => got_ws.push(data_of(&f)),
        }
    }
    assert_eq!((got_http, got_ws), (values.clone(), values.clone()), "live delivery");

    let mut late = srv.connect("late").await;
    let ok = late.subscribe("chat:kept", Some((0, &epoch))).await.unwrap();
    assert_eq!(ok.kind, "ok", "{ok:?}");
    let caught_up: Vec<String> = next_messages(&mut late, values.len()).await.iter().map(data_of).collect();
    assert_eq!(caught_up, values, "catch-up");
}

#[tokio::test]
async fn redeliveries_carry_data_byte_for_byte() {
    let srv = TestServer::start_with(|c| {
        let ns = NamespaceOptions {
            delivery: Delivery::Acked,
            ack_timeout: Duration::from_millis(200),
            ..Default::default()
        };
        c.namespaces.0.insert("inbox".into(), ns);
    })
    .await;
    let values = kept();
    for v in &values {
        assert_eq!(publish_http(&srv, "inbox:r", v).await.0, 201, "{v}");
    }
    let mut c = srv.connect("reader").await;
    assert_eq!(c.subscribe("inbox:r", None).await.unwrap().kind, "ok");
    let (mut first, mut again) = (BTreeMap::new(), BTreeMap::new());
    while again.len() < values.len() {
        let f = next_frame(&mut c).await;
        assert_eq!(f.kind, "message", "{f:?}");
        let seq = f.seq.unwrap();
        if f.redelivered == Some(true) {
            again.insert(seq, data_of(&f));
        } else {
            first.insert(seq, data_of(&f));
        }
    }
    assert_eq!(first.into_values().collect::<Vec<_>>(), values, "first deliveries");
    assert_eq!(again.into_values().collect::<Vec<_>>(), values, "redeliveries");
}

#[tokio::test]
async fn room_events_and_messages_are_served_as_stored() {
    let srv = TestServer::start().await;
    let r = srv
        .call(
            "PUT",
            "/api/v1/rooms/room:h",
            Some(json!({ "host": "host", "attributes": {"b": 1, "a": [2]} })),
            &[],
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let values = kept();
    for v in &values {
        assert_eq!(publish_http(&srv, "room:h", v).await.0, 201, "{v}");
    }
    let history = history_raw(&srv, "room:h").await;
    assert_eq!(history.len(), 1 + values.len());
    assert_eq!(history[0].0, "room");
    let messages: Vec<String> = history[1..].iter().map(|(_, _, d)| d.clone()).collect();
    assert_eq!(messages, values);

    // Catch-up hands out the very bytes history serves.
    let mut c = srv.connect("guest").await;
    let ok = c.subscribe("room:h", Some((0, ""))).await.unwrap();
    assert_eq!(ok.kind, "ok", "{ok:?}");
    let mut frames = Vec::new();
    while frames.len() < history.len() {
        let f = next_frame(&mut c).await;
        if matches!(f.kind.as_str(), "room" | "message") {
            frames.push((f.kind.clone(), f.seq.unwrap(), data_of(&f)));
        }
    }
    assert_eq!(frames, history);
}

#[tokio::test]
async fn data_breaking_the_publish_rules_is_refused_everywhere_and_stores_nothing() {
    let srv = TestServer::start().await;
    let mut c = srv.connect("publisher").await;
    for v in refused() {
        let (status, body) = publish_http(&srv, "chat:bad", &v).await;
        let problem: Value = serde_json::from_str(&body).unwrap();
        assert_eq!((status, problem["code"].as_str()), (400, Some("bad_data")), "{v}: {body}");
        let batch = format!(r#"{{"channels":["chat:bad","chat:bad2"],"data":{v}}}"#);
        let (status, body) = raw("POST", &srv, "/api/v1/publish", Some(&batch), &[]).await;
        let problem: Value = serde_json::from_str(&body).unwrap();
        assert_eq!((status, problem["code"].as_str()), (400, Some("bad_data")), "{v}: {body}");
        let reply = publish_socket(&mut c, "chat:bad", &v).await;
        assert_eq!((reply.kind.as_str(), reply.code.clone()), ("error", Some(json!("bad_data"))), "{v}");
    }
    assert!(history_raw(&srv, "chat:bad").await.is_empty());
    assert!(history_raw(&srv, "chat:bad2").await.is_empty());
    assert_eq!(c.ping().await.unwrap().kind, "pong", "the connection stays open");

    // The same depth rule for what rides inside other documents: room
    // attributes (inside every room event's `data`), presence `info`.
    let deep_attrs = format!(r#"{{"host":"h","attributes":{{"x":{}}}}}"#, nested(63));
    let (status, body) = raw("PUT", &srv, "/api/v1/rooms/room:deep", Some(&deep_attrs), &[]).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("bad_data"), "{body}");
    // Attributes are read as a JSON value: what it cannot hold is refused.
    for attrs in [r#"{"x":1e400}"#, r#"{"x":"\ud800"}"#] {
        let body = format!(r#"{{"host":"h","attributes":{attrs}}}"#);
        let (status, body) = raw("PUT", &srv, "/api/v1/rooms/room:deep", Some(&body), &[]).await;
        assert_eq!(status, 400, "{attrs}: {body}");
        assert!(body.contains("\"bad_json\""), "{attrs}: {body}");
    }
    let ok_attrs = format!(r#"{{"host":"h","attributes":{{"x":{}}}}}"#, nested(62));
    assert_eq!(raw("PUT", &srv, "/api/v1/rooms/room:deep", Some(&ok_attrs), &[]).await.0, 201);
    let req = c.next_req();
    let sub = format!(r#"{{"type":"subscribe","req":{req},"channel":"room:deep","info":{}}}"#, nested(65));
    c.send_raw(&sub).await.unwrap();
    let reply = tokio::time::timeout(WAIT, c.reply(req)).await.unwrap().unwrap();
    assert_eq!((reply.kind.as_str(), reply.code), ("error", Some(json!("bad_data"))));
}

#[tokio::test]
async fn the_depth_limit_is_a_setting() {
    let srv = TestServer::start_with(|c| c.publish.max_data_depth = 2).await;
    assert_eq!(publish_http(&srv, "chat:d", "[[1]]").await.0, 201);
    let (status, body) = publish_http(&srv, "chat:d", r#"[{"a":[]}]"#).await;
    assert_eq!(status, 400, "{body}");
}

fn publish_headers(key: &str) -> Vec<(&str, &str)> {
    vec![("idempotency-key", key)]
}

#[tokio::test]
async fn one_idempotency_key_is_one_request_whichever_endpoint_sends_it() {
    let srv = TestServer::start().await;
    let data = r#"{"n":1}"#;
    let single = format!(r#"{{"data":{data},"meta":{{"a":"1","b":"2"}}}}"#);
    let (status, body) =
        raw("POST", &srv, "/api/v1/channels/chat:k1/messages", Some(&single), &publish_headers("K")).await;
    assert_eq!(status, 201, "{body}");
    let first: Value = serde_json::from_str(&body).unwrap();

    // The same request through the batch endpoint (meta in another order):
    // a replay with the original receipt.
    let batch = format!(r#"{{"channels":["chat:k1"],"data":{data},"meta":{{"b":"2","a":"1"}}}}"#);
    let req = reqwest::Client::new()
        .post(format!("{}/api/v1/publish", srv.url))
        .bearer_auth(API_KEY)
        .header("idempotency-key", "K")
        .header("content-type", "application/json")
        .body(batch)
        .send()
        .await
        .unwrap();
    assert_eq!(req.status().as_u16(), 201);
    assert_eq!(req.headers().get("idempotent-replayed").map(|v| v.to_str().unwrap()), Some("true"));
    let replay: Value = req.json().await.unwrap();
    assert_eq!(replay["results"][0], first);

    // Anything else under the key is another request: 422, nothing appended.
    for (path, body) in [
        ("/api/v1/publish", format!(r#"{{"channels":["chat:k1","chat:k2"],"data":{data}}}"#)),
        ("/api/v1/publish", format!(r#"{{"channels":["chat:k2"],"data":{data}}}"#)),
        ("/api/v1/channels/chat:k2/messages", format!(r#"{{"data":{data}}}"#)),
        ("/api/v1/channels/chat:k1/messages", r#"{"data":{"n":2}}"#.to_owned()),
        ("/api/v1/channels/chat:k1/messages", format!(r#"{{"data":{data}}}"#)),
    ] {
        let (status, text) = raw("POST", &srv, path, Some(&body), &publish_headers("K")).await;
        let problem: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (status, problem["code"].as_str()),
            (422, Some("idempotency_key_reused")),
            "{path} {body}: {text}"
        );
    }
    assert_eq!(history_raw(&srv, "chat:k1").await.len(), 1);
    assert!(history_raw(&srv, "chat:k2").await.is_empty(), "a refused batch appends nowhere");

    // Batch first, then a different batch under its key: nothing appended
    // on the channel only the second one names.
    let b1 = format!(r#"{{"channels":["chat:k3","chat:k4"],"data":{data}}}"#);
    assert_eq!(raw("POST", &srv, "/api/v1/publish", Some(&b1), &publish_headers("K2")).await.0, 201);
    let b2 = format!(r#"{{"channels":["chat:k3","chat:k5"],"data":{data}}}"#);
    assert_eq!(raw("POST", &srv, "/api/v1/publish", Some(&b2), &publish_headers("K2")).await.0, 422);
    let single = format!(r#"{{"data":{data}}}"#);
    assert_eq!(
        raw("POST", &srv, "/api/v1/channels/chat:k3/messages", Some(&single), &publish_headers("K2")).await.0,
        422
    );
    assert!(history_raw(&srv, "chat:k5").await.is_empty());
    assert_eq!(history_raw(&srv, "chat:k3").await.len(), 1);
    assert_eq!(history_raw(&srv, "chat:k4").await.len(), 1);
    let (status, _) = raw("POST", &srv, "/api/v1/publish", Some(&b1), &publish_headers("K2")).await;
    assert_eq!(status, 201, "the original batch still replays");
    assert_eq!(history_raw(&srv, "chat:k4").await.len(), 1);
}

#[tokio::test]
async fn a_socket_key_is_one_request_for_its_user() {
    let srv = TestServer::start().await;
    let mut c = srv.connect("sam").await;
    let a = c.publish("chat:s1", &json!(1), Some("k")).await.unwrap();
    assert_eq!((a.kind.as_str(), a.duplicate), ("ok", Some(false)));
    let b = c.publish("chat:s2", &json!(1), Some("k")).await.unwrap();
    assert_eq!((b.kind.as_str(), b.code), ("error", Some(json!("idempotency_key_reused"))));
    assert!(history_raw(&srv, "chat:s2").await.is_empty());
}

#[tokio::test]
async fn two_idempotency_key_headers_are_a_bad_request() {
    let srv = TestServer::start().await;
    let two = [("idempotency-key", "a"), ("idempotency-key", "b")];
    let same = [("idempotency-key", "a"), ("idempotency-key", "a")];
    for headers in [&two[..], &same[..]] {
        let (status, body) =
            raw("POST", &srv, "/api/v1/channels/chat:h/messages", Some(r#"{"data":1}"#), headers).await;
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("idempotency_key_invalid"), "{body}");
        let batch = r#"{"channels":["chat:h"],"data":1}"#;
        let (status, body) = raw("POST", &srv, "/api/v1/publish", Some(batch), headers).await;
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("idempotency_key_invalid"), "{body}");
    }
    assert!(history_raw(&srv, "chat:h").await.is_empty());
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

fn token(claims: Value) -> String {
    encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(JWT_SECRET.as_bytes())).unwrap()
}

async fn refusal(opts: ConnectOptions) -> (u16, String) {
    match Connection::connect(&opts).await {
        Ok(_) => (101, String::new()),
        Err(e) => (e.http_status().expect("an HTTP refusal"), e.code().unwrap_or("").to_owned()),
    }
}

#[tokio::test]
async fn identity_fields_follow_one_rule() {
    let srv = TestServer::start().await;
    let long = "u".repeat(256);
    let max = "u".repeat(255);
    let exp = now() + 300;

    // Token claims: 401 before the upgrade.
    for sub in ["a\nb", "a\r\nX-Injected: 1", "nul\0", "tab\t", "\u{85}", "", long.as_str()] {
        let t = token(json!({ "sub": sub, "exp": exp }));
        assert_eq!(
            refusal(ConnectOptions::token(&srv.url, t)).await,
            (401, "unauthorized".into()),
            "sub {sub:?}"
        );
    }
    for device in ["d\n", "\u{1b}[2J", "", long.as_str()] {
        let t = token(json!({ "sub": "ok", "device": device, "exp": exp }));
        assert_eq!(
            refusal(ConnectOptions::token(&srv.url, t)).await,
            (401, "unauthorized".into()),
            "device {device:?}"
        );
    }
    let t = token(json!({ "sub": max, "device": max, "exp": exp }));
    assert_eq!(refusal(ConnectOptions::token(&srv.url, t)).await.0, 101, "255 bytes is an id");

    // Query parameters: 400.
    for bad in ["a\nb", long.as_str()] {
        assert_eq!(
            refusal(ConnectOptions::dev_user(&srv.url, bad)).await,
            (400, "bad_request".into()),
            "user {bad:?}"
        );
        let mut opts = ConnectOptions::dev_user(&srv.url, "ok");
        opts.device = Some(bad.to_owned());
        assert_eq!(refusal(opts).await, (400, "bad_request".into()), "device {bad:?}");
    }
    let mut opts = ConnectOptions::dev_user(&srv.url, &max);
    opts.device = Some(max.clone());
    Connection::connect(&opts).await.expect("255-byte user and device ids");

    // HTTP paths.
    for (user, status) in [("a%0Ab", 400), ("a%00", 400), (long.as_str(), 400), (max.as_str(), 200)] {
        let (got, body) = raw("GET", &srv, &format!("/api/v1/users/{user}/inbox"), None, &[]).await;
        assert_eq!(got, status, "{user}: {body}");
    }
}

#[tokio::test]
async fn the_cli_publishes_and_tails_data_as_written() {
    const BIN: &str = env!("CARGO_BIN_EXE_herald");
    let srv = TestServer::start().await;
    let data = r#"{"b":1,"a":[1e400, 123456789012345678901234567890]}"#;
    let out = tokio::process::Command::new(BIN)
        .args(["publish", "chat:cli", data, "--url", &srv.url, "--api-key", API_KEY])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(history_raw(&srv, "chat:cli").await[0].2, data, "published as written");

    let tail = tokio::process::Command::new(BIN)
        .args(["tail", "chat:cli", "--since", "0", "--user", "me", "--count", "1", "--url", &srv.url])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(WAIT, tail).await.expect("tail ends after one message").unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    #[derive(Deserialize)]
    struct Line<'a> {
        #[serde(borrow)]
        data: &'a RawValue,
    }
    let text = String::from_utf8(out.stdout).unwrap();
    let line: Line<'_> = serde_json::from_str(text.trim_end()).expect("one JSON line");
    assert_eq!(line.data.get(), data, "printed as received");
}
