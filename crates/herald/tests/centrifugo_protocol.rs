//! The Centrifugo endpoint (`/connection/websocket`) through raw frames:
//! batching of commands, newline framing, close codes, recovery, acked
//! inboxes, and delivery across both protocols with the same seqs.

use std::collections::VecDeque;
use std::time::{SystemTime, UNIX_EPOCH};

use futures_util::{SinkExt, StreamExt};
use herald_test_support::*;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use tokio_websockets::{MaybeTlsStream, Message, WebSocketStream};

type Socket = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

/// A raw Centrifugo JSON client: commands out, replies and pushes in.
struct Cf {
    ws: Socket,
    next_id: u32,
    /// Objects read and not consumed yet.
    inbox: VecDeque<Value>,
}

impl Cf {
    async fn dial(srv: &TestServer, query: &str) -> Self {
        let url = format!("ws://{}/connection/websocket{query}", srv.addr);
        let (ws, _) =
            tokio_websockets::ClientBuilder::new().uri(&url).unwrap().connect().await.expect("dial");
        Cf { ws, next_id: 0, inbox: VecDeque::new() }
    }

    /// Connected in dev mode as `user`.
    async fn dev(srv: &TestServer, user: &str) -> Self {
        let mut c = Self::dial(srv, &format!("?user={user}")).await;
        let r = c.call(json!({ "connect": {} })).await;
        assert!(r["connect"]["client"].is_string(), "{r}");
        c
    }

    /// Send commands in one frame; returns their ids.
    async fn send(&mut self, cmds: Vec<Value>) -> Vec<u32> {
        let mut ids = Vec::new();
        let mut lines = Vec::new();
        for mut c in cmds {
            self.next_id += 1;
            c["id"] = json!(self.next_id);
            ids.push(self.next_id);
            lines.push(c.to_string());
        }
        self.ws.send(Message::text(lines.join("\n"))).await.expect("send");
        ids
    }

    /// The next object the server sent (each line of a frame must parse).
    async fn next(&mut self) -> Value {
        loop {
            if let Some(v) = self.inbox.pop_front() {
                return v;
            }
            let msg = tokio::time::timeout(WAIT, self.ws.next()).await.expect("frame in time");
            let msg = msg.expect("socket open").expect("frame");
            let Some(text) = msg.as_text() else { continue };
            for line in text.split('\n') {
                self.inbox.push_back(serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}")));
            }
        }
    }

    /// The reply to `id`; pushes read meanwhile stay queued.
    async fn reply(&mut self, id: u32) -> Value {
        let mut skipped = VecDeque::new();
        loop {
            let v = self.next().await;
            if v["id"] == json!(id) {
                skipped.extend(self.inbox.drain(..));
                self.inbox = skipped;
                return v;
            }
            skipped.push_back(v);
        }
    }

    async fn call(&mut self, cmd: Value) -> Value {
        let id = self.send(vec![cmd]).await[0];
        self.reply(id).await
    }

    /// The next `pub` push (skipping pings and other pushes).
    async fn publication(&mut self) -> Value {
        loop {
            let v = self.next().await;
            if !v["push"]["pub"].is_null() {
                return v["push"].clone();
            }
        }
    }

    /// Read until the server closes; its close code.
    async fn closed(&mut self) -> Option<u16> {
        loop {
            match tokio::time::timeout(WAIT, self.ws.next()).await.expect("close in time") {
                Some(Ok(m)) if m.is_close() => return m.as_close().map(|(c, _)| c.into()),
                Some(Ok(_)) => {}
                _ => return None,
            }
        }
    }
}

fn token(sub: &str, channels: &[&str], exp_in: i64) -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    token_until(sub, channels, now + exp_in)
}

/// A token expiring at `exp` (s since the Unix epoch).
fn token_until(sub: &str, channels: &[&str], exp: i64) -> String {
    let claims = json!({ "sub": sub, "channels": channels, "publish": channels, "exp": exp });
    encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(JWT_SECRET.as_bytes())).unwrap()
}

#[tokio::test]
async fn commands_in_one_frame_are_answered_in_order_with_their_ids() {
    let srv = TestServer::start().await;
    let mut c = Cf::dial(&srv, "?user=u1").await;
    let ids = c
        .send(vec![
            json!({ "connect": { "name": "raw" }, "unknown": 1 }),
            json!({ "subscribe": { "channel": "chat:batch" } }),
            json!({ "publish": { "channel": "chat:batch", "data": { "n": 1 } } }),
            json!({ "history": { "channel": "chat:batch", "limit": 10 } }),
            json!({ "rpc": { "method": "x" } }),
        ])
        .await;
    let mut replies = Vec::new();
    while replies.len() < ids.len() {
        let v = c.next().await;
        if v.get("id").is_some() {
            replies.push(v);
        }
    }
    let got: Vec<u64> = replies.iter().map(|r| r["id"].as_u64().unwrap()).collect();
    assert_eq!(got, ids.iter().map(|&i| u64::from(i)).collect::<Vec<_>>());
    let connect = &replies[0]["connect"];
    assert_eq!(connect["pong"], true);
    assert!(connect["ping"].as_u64().unwrap() > 0);
    assert_eq!(replies[1]["subscribe"]["recoverable"], true);
    assert_eq!(replies[1]["subscribe"]["positioned"], true);
    assert!(replies[2]["publish"].is_object(), "{}", replies[2]);
    // The history command waited for the publish before it: it sees it.
    assert_eq!(replies[3]["history"]["publications"][0]["data"], json!({ "n": 1 }));
    assert_eq!(replies[3]["history"]["publications"][0]["offset"], 1);
    assert_eq!(replies[4]["error"]["code"], 108);
    // And the subscriber got its own publish as a push.
    let p = c.publication().await;
    assert_eq!(p["channel"], "chat:batch");
    assert_eq!(p["pub"]["offset"], 1);
}

#[tokio::test]
async fn data_with_raw_newlines_arrives_intact() {
    let srv = TestServer::start().await;
    let mut c = Cf::dev(&srv, "u1").await;
    c.call(json!({ "subscribe": { "channel": "chat:nl" } })).await;
    let body = b"{\"data\": {\n  \"text\": \"line1\\nline2\",\n  \"n\": [1,\n 2]\n}}".to_vec();
    let r = srv
        .post_raw(
            "/api/v1/channels/chat:nl/messages",
            body,
            &[("content-type", "application/json"), ("authorization", &format!("Bearer {API_KEY}"))],
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let p = c.publication().await;
    assert_eq!(p["pub"]["data"], json!({ "text": "line1\nline2", "n": [1, 2] }));
    // History and recovery go through the same framing.
    let h = c.call(json!({ "history": { "channel": "chat:nl", "limit": -1 } })).await;
    assert_eq!(h["history"]["publications"][0]["data"]["text"], "line1\nline2");
}

#[tokio::test]
async fn bad_token_closes_in_the_sdk_stop_range() {
    let srv = TestServer::start_with(|c| c.dev = false).await;
    let mut c = Cf::dial(&srv, "").await;
    c.send(vec![json!({ "connect": { "token": "not-a-jwt" } })]).await;
    assert_eq!(c.closed().await, Some(3500));
    // No token outside dev mode: the same.
    let mut c = Cf::dial(&srv, "?user=u1").await;
    c.send(vec![json!({ "connect": {} })]).await;
    assert_eq!(c.closed().await, Some(3500));
    // Expired: error 109, so the SDK fetches a new token and connects again.
    let mut c = Cf::dial(&srv, "").await;
    let r = c.call(json!({ "connect": { "token": token("u1", &["chat:*"], -3600) } })).await;
    assert_eq!(r["error"]["code"], 109, "{r}");
    let r = c.call(json!({ "connect": { "token": token("u1", &["chat:*"], 3600) } })).await;
    assert!(r["connect"].is_object(), "{r}");
    // A command before connect, and a malformed one: protocol violations.
    let mut c = Cf::dial(&srv, "").await;
    c.send(vec![json!({ "subscribe": { "channel": "chat:a" } })]).await;
    assert_eq!(c.closed().await, Some(3501));
    let mut c = Cf::dial(&srv, "").await;
    c.ws.send(Message::text("{not json")).await.unwrap();
    assert_eq!(c.closed().await, Some(3501));
}

#[tokio::test]
async fn token_permissions_apply_and_refresh_keeps_the_connection() {
    let srv = TestServer::start_with(|c| c.dev = false).await;
    let mut c = Cf::dial(&srv, "").await;
    let r = c.call(json!({ "connect": { "token": token("u1", &["chat:ok*"], 3600) } })).await;
    assert_eq!(r["connect"]["expires"], true);
    assert!(r["connect"]["ttl"].as_u64().unwrap() > 2000, "refresh ahead of exp: {r}");
    let r = c.call(json!({ "subscribe": { "channel": "chat:no" } })).await;
    assert_eq!(r["error"]["code"], 103, "{r}");
    let r = c.call(json!({ "subscribe": { "channel": "chat:ok1" } })).await;
    assert!(r["subscribe"].is_object(), "{r}");
    let r = c.call(json!({ "refresh": { "token": token("u1", &["chat:*"], 7200) } })).await;
    assert!(r["refresh"]["ttl"].as_u64().unwrap() > 5000, "{r}");
    let r = c.call(json!({ "subscribe": { "channel": "chat:no" } })).await;
    assert!(r["subscribe"].is_object(), "the refreshed token allows it: {r}");
    // Another user's token on this connection: refused, and the SDK stops.
    c.send(vec![json!({ "refresh": { "token": token("u2", &["chat:*"], 3600) } })]).await;
    assert_eq!(c.closed().await, Some(3500));
}

#[tokio::test]
async fn both_protocols_see_every_message_in_the_same_order_with_the_same_seq() {
    let srv = TestServer::start().await;
    let mut cf = Cf::dev(&srv, "cf").await;
    cf.call(json!({ "subscribe": { "channel": "chat:x" } })).await;
    // A second Centrifugo subscriber shares the push made once per message.
    let mut cf2 = Cf::dev(&srv, "cf2").await;
    cf2.call(json!({ "subscribe": { "channel": "chat:x" } })).await;
    let mut herald = srv.connect("h").await;
    herald.subscribe("chat:x", None).await.expect("subscribe");
    // One from each side and one over HTTP.
    let r = cf.call(json!({ "publish": { "channel": "chat:x", "data": "from-cf" } })).await;
    assert!(r["publish"].is_object(), "{r}");
    herald.publish("chat:x", &json!("from-herald"), None).await.expect("publish");
    assert_eq!(srv.publish("chat:x", json!("from-http")).await.status, 201);
    let on_herald = next_messages(&mut herald, 3).await;
    let mut on_cf = Vec::new();
    for _ in 0..3 {
        on_cf.push(cf.publication().await);
    }
    for (h, c) in on_herald.iter().zip(&on_cf) {
        assert_eq!(h.seq, c["pub"]["offset"].as_u64());
        assert_eq!(h.data.as_ref().map(|d| d.get().to_owned()), Some(c["pub"]["data"].to_string()));
        assert_eq!(h.id.as_deref(), c["pub"]["tags"]["herald_id"].as_str());
    }
    assert_eq!(seqs(&on_herald), vec![1, 2, 3]);
    for c in &on_cf {
        assert_eq!(&cf2.publication().await, c);
    }
}

/// Subscribe, read up to offset 2, go away, miss 3..=5, come back with the
/// position: exactly 3..=5 in the reply, then 6 live.
#[tokio::test]
async fn recovery_returns_exactly_the_missed_messages_then_live_ones() {
    let srv = TestServer::start().await;
    let mut c = Cf::dev(&srv, "u1").await;
    let r = c.call(json!({ "subscribe": { "channel": "chat:r" } })).await;
    let epoch = r["subscribe"]["epoch"].as_str().unwrap().to_owned();
    for i in 1..=2 {
        srv.publish("chat:r", json!(i)).await;
    }
    assert_eq!(c.publication().await["pub"]["offset"], 1);
    assert_eq!(c.publication().await["pub"]["offset"], 2);
    drop(c);
    for i in 3..=5 {
        srv.publish("chat:r", json!(i)).await;
    }
    let mut c = Cf::dev(&srv, "u1").await;
    let r = c
        .call(json!({ "subscribe": { "channel": "chat:r", "recover": true, "offset": 2, "epoch": epoch } }))
        .await;
    let s = &r["subscribe"];
    assert_eq!(s["recovered"], true, "{r}");
    assert_eq!(s["was_recovering"], true);
    let offsets: Vec<u64> =
        s["publications"].as_array().unwrap().iter().map(|p| p["offset"].as_u64().unwrap()).collect();
    assert_eq!(offsets, vec![3, 4, 5]);
    assert_eq!(s["offset"], 5);
    srv.publish("chat:r", json!(6)).await;
    assert_eq!(c.publication().await["pub"]["offset"], 6);
}

#[tokio::test]
async fn recovery_beyond_the_bound_another_epoch_or_the_future_is_not_recovered() {
    let srv = TestServer::start_with(|c| c.history.max_limit = 3).await;
    for i in 1..=6 {
        srv.publish("chat:b", json!(i)).await;
    }
    let mut c = Cf::dev(&srv, "u1").await;
    let epoch = c.call(json!({ "subscribe": { "channel": "chat:b" } })).await["subscribe"]["epoch"]
        .as_str()
        .unwrap()
        .to_owned();
    c.call(json!({ "unsubscribe": { "channel": "chat:b" } })).await;
    for (offset, epoch) in [(1, epoch.as_str()), (99, epoch.as_str()), (u64::MAX, ""), (5, "another")] {
        let r = c
            .call(json!({ "subscribe": { "channel": "chat:b", "recover": true, "offset": offset, "epoch": epoch } }))
            .await;
        let s = &r["subscribe"];
        assert_eq!(s["recovered"], Value::Null, "offset {offset} epoch {epoch}: {r}");
        assert_eq!(s["publications"], Value::Null, "{r}");
        assert_eq!(s["offset"], 6);
        c.call(json!({ "unsubscribe": { "channel": "chat:b" } })).await;
    }
    // Within the bound: recovered.
    let r = c
        .call(json!({ "subscribe": { "channel": "chat:b", "recover": true, "offset": 3, "epoch": epoch } }))
        .await;
    assert_eq!(r["subscribe"]["recovered"], true, "{r}");
    assert_eq!(r["subscribe"]["publications"].as_array().unwrap().len(), 3);
}

/// Acked channels: the offline inbox is the first subscribe's recovery, and
/// a recover offset acknowledges up to it.
#[tokio::test]
async fn acked_inbox_arrives_as_recovery_and_the_recover_offset_acks() {
    let srv = TestServer::start().await;
    for i in 1..=3 {
        srv.publish("user:u1", json!(i)).await;
    }
    let mut c = Cf::dev(&srv, "u1").await;
    let r = c.call(json!({ "subscribe": { "channel": "user:u1" } })).await;
    let s = &r["subscribe"];
    let offsets: Vec<u64> =
        s["publications"].as_array().unwrap().iter().map(|p| p["offset"].as_u64().unwrap()).collect();
    assert_eq!(offsets, vec![1, 2, 3], "{r}");
    let epoch = s["epoch"].as_str().unwrap().to_owned();
    // Nothing acked yet: the inbox is whole again.
    drop(c);
    let mut c = Cf::dev(&srv, "u1").await;
    let r = c.call(json!({ "subscribe": { "channel": "user:u1" } })).await;
    assert_eq!(r["subscribe"]["publications"].as_array().unwrap().len(), 3);
    // A recover offset of 2 acks 1..=2.
    c.call(json!({ "unsubscribe": { "channel": "user:u1" } })).await;
    let r = c
        .call(json!({ "subscribe": { "channel": "user:u1", "recover": true, "offset": 2, "epoch": epoch } }))
        .await;
    assert_eq!(r["subscribe"]["recovered"], true);
    assert_eq!(r["subscribe"]["publications"][0]["offset"], 3);
    drop(c);
    let mut c = Cf::dev(&srv, "u1").await;
    let r = c.call(json!({ "subscribe": { "channel": "user:u1" } })).await;
    let offsets: Vec<u64> = r["subscribe"]["publications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets, vec![3], "the cursor stayed at 2: {r}");
}

#[tokio::test]
async fn history_reads_since_a_position_with_a_limit() {
    let srv = TestServer::start().await;
    for i in 1..=5 {
        srv.publish("chat:h", json!(i)).await;
    }
    let mut c = Cf::dev(&srv, "u1").await;
    let r = c.call(json!({ "history": { "channel": "chat:h", "limit": 0 } })).await;
    assert_eq!(r["history"]["offset"], 5);
    assert_eq!(r["history"]["publications"], Value::Null);
    let epoch = r["history"]["epoch"].as_str().unwrap().to_owned();
    let r = c
        .call(json!({ "history": { "channel": "chat:h", "limit": 2, "since": { "offset": 2, "epoch": epoch } } }))
        .await;
    let data: Vec<Value> =
        r["history"]["publications"].as_array().unwrap().iter().map(|p| p["data"].clone()).collect();
    assert_eq!(data, vec![json!(3), json!(4)]);
    let r = c.call(json!({ "history": { "channel": "chat:h", "limit": 2, "reverse": true } })).await;
    let data: Vec<Value> =
        r["history"]["publications"].as_array().unwrap().iter().map(|p| p["data"].clone()).collect();
    assert_eq!(data, vec![json!(5), json!(4)]);
    let r = c
        .call(json!({ "history": { "channel": "chat:h", "limit": 2, "since": { "offset": 2, "epoch": "old" } } }))
        .await;
    assert_eq!(r["error"]["code"], 112);
}

#[tokio::test]
async fn the_server_pings_with_an_empty_object() {
    let srv = TestServer::start_with(|c| {
        c.heartbeat.ping_interval = std::time::Duration::from_millis(200);
        c.heartbeat.idle_timeout = std::time::Duration::from_secs(10);
    })
    .await;
    let mut c = Cf::dev(&srv, "u1").await;
    let v = c.next().await;
    assert_eq!(v, json!({}));
    // The pong keeps the connection alive past the idle timeout's checks.
    c.ws.send(Message::text("{}")).await.unwrap();
    assert_eq!(c.next().await, json!({}));
}

/// Sleeps until `at_ms` (ms since the Unix epoch).
async fn sleep_until_ms(at_ms: u128) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis();
    tokio::time::sleep(std::time::Duration::from_millis(at_ms.saturating_sub(now) as u64)).await;
}

#[tokio::test]
async fn an_expired_token_has_the_refresh_grace_then_closes_with_3005() {
    let srv = TestServer::start_with(|c| {
        c.dev = false;
        c.jwt.refresh_grace = std::time::Duration::from_secs(2);
    })
    .await;
    let exp = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64 + 1;
    let short = token_until("u1", &["chat:*"], exp);
    let exp = exp as u128 * 1000;
    let mut late = Cf::dial(&srv, "").await;
    let r = late.call(json!({ "connect": { "token": short.clone() } })).await;
    assert_eq!(r["connect"]["ttl"], 1, "the protocol's least ttl: {r}");
    let mut idle = Cf::dial(&srv, "").await;
    assert!(idle.call(json!({ "connect": { "token": short } })).await["connect"].is_object());
    // Past exp, inside the grace: both connections still answer, and a
    // refresh arriving now keeps its connection.
    sleep_until_ms(exp + 500).await;
    let r = late.call(json!({ "subscribe": { "channel": "chat:a" } })).await;
    assert!(r["subscribe"].is_object(), "open inside the grace: {r}");
    let r = idle.call(json!({ "subscribe": { "channel": "chat:a" } })).await;
    assert!(r["subscribe"].is_object(), "open inside the grace: {r}");
    let r = late.call(json!({ "refresh": { "token": token("u1", &["chat:*"], 3600) } })).await;
    assert!(r["refresh"]["ttl"].as_u64().unwrap() > 2000, "{r}");
    // Past the grace: the one without a refresh is closed as expired.
    assert_eq!(idle.closed().await, Some(3005));
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis();
    assert!(now >= exp + 2000, "closed {} ms after exp, before the grace ran out", now - exp);
    let r = late.call(json!({ "subscribe": { "channel": "chat:b" } })).await;
    assert!(r["subscribe"].is_object(), "the refreshed connection stays: {r}");
}

#[tokio::test]
async fn shutdown_and_rate_limits_close_with_reconnect_codes() {
    let mut srv = TestServer::start_with(|c| c.rate_limits.client_frames_per_sec = 5).await;
    let mut c = Cf::dev(&srv, "u1").await;
    // Over the budget: error 111 (temporary) replies, then a close the SDK
    // reconnects after.
    let ids = c.send((0..40).map(|_| json!({ "ping": {} })).collect()).await;
    let mut limited = 0;
    for id in ids {
        let r = c.reply(id).await;
        if r["error"]["code"] == 111 {
            assert_eq!(r["error"]["temporary"], true);
            limited += 1;
            break;
        }
    }
    assert!(limited > 0);
    let mut c = Cf::dev(&srv, "u2").await;
    srv.stop_now().await;
    assert_eq!(c.closed().await, Some(3001));
}

#[tokio::test]
async fn metrics_count_connections_and_commands_by_protocol() {
    let srv = TestServer::start().await;
    let mut c = Cf::dev(&srv, "u1").await;
    c.call(json!({ "ping": {} })).await;
    let _herald = srv.connect("h").await;
    let text = reqwest::get(format!("{}/metrics", srv.url)).await.unwrap().text().await.unwrap();
    assert!(text.contains("herald_protocol_connections{protocol=\"centrifugo\"} 1"), "{text}");
    assert!(text.contains("herald_protocol_connections{protocol=\"herald\"} 1"), "{text}");
    assert!(text.contains("herald_protocol_frames_total{protocol=\"centrifugo\"} 2"), "{text}");
}

/// A subscriber that stops reading is closed with 3008 (the SDK reconnects)
/// and recovers the rest: nothing missing, nothing doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_consumer_is_closed_with_3008_and_recovers_the_rest() {
    const TOTAL: u64 = 400;
    let srv = std::sync::Arc::new(TestServer::start_with(|c| c.websocket.outbox_capacity = 16).await);
    let mut c = Cf::dev(&srv, "slow").await;
    let epoch = c.call(json!({ "subscribe": { "channel": "chat:slow" } })).await["subscribe"]["epoch"]
        .as_str()
        .unwrap()
        .to_owned();
    // 400 x 32 KiB: more than the socket buffers hold while nothing is read.
    let blob = "x".repeat(32 * 1024);
    let mut tasks = Vec::new();
    for w in 0..4u64 {
        let (srv, blob) = (srv.clone(), blob.clone());
        tasks.push(tokio::spawn(async move {
            for i in (w..TOTAL).step_by(4) {
                assert_eq!(srv.publish("chat:slow", json!({ "i": i, "blob": blob })).await.status, 201);
            }
        }));
    }
    let state = srv.state.clone();
    assert_eventually("slow consumer kicked", || {
        let state = state.clone();
        async move { state.metrics.render().contains("herald_slow_consumer_disconnects_total 1") }
    })
    .await;
    let mut got = Vec::new();
    let code = loop {
        let msg = tokio::time::timeout(WAIT, c.ws.next()).await.expect("frame in time");
        let Some(Ok(msg)) = msg else { break None };
        if msg.is_close() {
            break msg.as_close().map(|(code, _)| u16::from(code));
        }
        for line in msg.as_text().unwrap_or_default().split('\n').filter(|l| !l.is_empty()) {
            let v: Value = serde_json::from_str(line).unwrap();
            if let Some(offset) = v["push"]["pub"]["offset"].as_u64() {
                got.push(offset);
            }
        }
    };
    assert_eq!(code, Some(3008));
    assert_eq!(got, (1..=got.len() as u64).collect::<Vec<_>>(), "in order, gap-free");
    for t in tasks {
        t.await.unwrap();
    }
    let last = got.len() as u64;
    let mut c = Cf::dev(&srv, "slow").await;
    let r = c
        .call(json!({ "subscribe": { "channel": "chat:slow", "recover": true, "offset": last, "epoch": epoch } }))
        .await;
    assert_eq!(r["subscribe"]["recovered"], true);
    let mut rest: Vec<u64> = r["subscribe"]["publications"]
        .as_array()
        .map(|a| a.iter().map(|p| p["offset"].as_u64().unwrap()).collect())
        .unwrap_or_default();
    // What the reply could not hold follows as pushes.
    while rest.len() < (TOTAL - last) as usize {
        rest.push(c.publication().await["pub"]["offset"].as_u64().unwrap());
    }
    assert_eq!(rest, (last + 1..=TOTAL).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_user_limited_channel_is_its_users_only() {
    let srv = TestServer::start_with(|c| {
        let dm = herald_core::NamespaceOptions { allow_user_limited: true, ..Default::default() };
        c.namespaces.0.insert("dm".into(), dm);
    })
    .await;
    let channel = "dm:chat#42,43";
    let mut listed = Cf::dev(&srv, "42").await;
    let r = listed.call(json!({ "subscribe": { "channel": channel } })).await;
    assert!(r["subscribe"].is_object(), "{r}");
    let mut third = Cf::dev(&srv, "44").await;
    for cmd in [json!({ "subscribe": { "channel": channel } }), json!({ "history": { "channel": channel } })]
    {
        let r = third.call(cmd).await;
        assert_eq!(r["error"]["code"], 103, "permission denied: {r}");
    }
    srv.publish(channel, json!({ "to": "both" })).await;
    let p = listed.publication().await;
    assert_eq!(p["channel"], channel, "{p}");
}

/// Connect with `token` and the SDK's `subs` positions; the connect reply.
async fn connect_with(c: &mut Cf, token: &str, subs: Value) -> Value {
    c.call(json!({ "connect": { "token": token, "subs": subs } })).await
}

#[tokio::test]
async fn token_channels_are_server_side_subscriptions_and_patterns_permissions() {
    let srv = TestServer::start_with(|c| c.dev = false).await;
    let mut c = Cf::dial(&srv, "").await;
    let r =
        connect_with(&mut c, &token("u1", &["chat:ss1", "chat:ss2", "chat:open*"], 3600), json!({})).await;
    let subs = r["connect"]["subs"].as_object().unwrap_or_else(|| panic!("subs in the reply: {r}"));
    assert_eq!(subs.keys().collect::<Vec<_>>(), ["chat:ss1", "chat:ss2"], "names subscribe, patterns do not");
    for s in subs.values() {
        assert_eq!((s["recoverable"].clone(), s["positioned"].clone()), (json!(true), json!(true)), "{s}");
        assert!(s["epoch"].is_string(), "{s}");
    }
    // Pushes arrive with their channel, no subscribe command sent.
    srv.publish("chat:ss2", json!("b")).await;
    srv.publish("chat:ss1", json!("a")).await;
    let (p1, p2) = (c.publication().await, c.publication().await);
    assert_eq!((p1["channel"].clone(), p1["pub"]["data"].clone()), (json!("chat:ss2"), json!("b")));
    assert_eq!((p2["channel"].clone(), p2["pub"]["data"].clone()), (json!("chat:ss1"), json!("a")));
    // The pattern is a permission: a client-side subscribe under it works.
    let r = c.call(json!({ "subscribe": { "channel": "chat:open1" } })).await;
    assert!(r["subscribe"].is_object(), "{r}");
    // Subscribing a server-side one again is refused, the connection stays.
    let r = c.call(json!({ "subscribe": { "channel": "chat:ss1" } })).await;
    assert!(r["error"].is_object(), "{r}");
    assert!(c.call(json!({ "ping": {} })).await["ping"].is_object());
}

#[tokio::test]
async fn server_side_subscriptions_recover_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let srv = TestServer::start_in(dir.path().to_path_buf(), |c| c.dev = false).await;
    let tok = token("u1", &["chat:keep"], 3600);
    let mut c = Cf::dial(&srv, "").await;
    let r = connect_with(&mut c, &tok, json!({})).await;
    let epoch = r["connect"]["subs"]["chat:keep"]["epoch"].as_str().unwrap().to_owned();
    for i in 1..=3 {
        srv.publish("chat:keep", json!(i)).await;
    }
    for i in 1..=3 {
        assert_eq!(c.publication().await["pub"]["offset"], i);
    }
    drop(c);
    for i in 4..=5 {
        srv.publish("chat:keep", json!(i)).await;
    }
    srv.stop().await;
    let srv = TestServer::start_in(dir.path().to_path_buf(), |c| c.dev = false).await;
    srv.publish("chat:keep", json!(6)).await;

    let mut c = Cf::dial(&srv, "").await;
    let r =
        connect_with(&mut c, &tok, json!({ "chat:keep": { "recover": true, "offset": 3, "epoch": epoch } }))
            .await;
    let s = &r["connect"]["subs"]["chat:keep"];
    assert_eq!((s["recovered"].clone(), s["was_recovering"].clone()), (json!(true), json!(true)), "{r}");
    let offsets: Vec<u64> =
        s["publications"].as_array().unwrap().iter().map(|p| p["offset"].as_u64().unwrap()).collect();
    assert_eq!(offsets, vec![4, 5, 6], "exactly what was missed");
    assert_eq!(s["offset"], 6);
    srv.publish("chat:keep", json!(7)).await;
    let p = c.publication().await;
    assert_eq!(
        (p["channel"].clone(), p["pub"]["offset"].clone()),
        (json!("chat:keep"), json!(7)),
        "then live"
    );
    // A position from another epoch is not recovered: live from the head.
    let mut c2 = Cf::dial(&srv, "").await;
    let r = connect_with(
        &mut c2,
        &tok,
        json!({ "chat:keep": { "recover": true, "offset": 1, "epoch": "other" } }),
    )
    .await;
    let s = &r["connect"]["subs"]["chat:keep"];
    assert!(s["recovered"].is_null() && s["publications"].is_null(), "{r}");
}

#[tokio::test]
async fn caps_grant_client_side_subscribes_without_subscribing() {
    let srv = TestServer::start_with(|c| c.dev = false).await;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let claims = json!({
        "sub": "u1", "exp": now + 3600,
        "caps": [{ "channels": ["chat:cap1"], "allow": ["sub"] }, { "channels": ["chat:w*"], "allow": ["sub", "pub"], "match": "wildcard" }],
    });
    let mut c = Cf::dial(&srv, "").await;
    let r = connect_with(&mut c, &hs256_token(&claims), json!({})).await;
    assert!(r["connect"]["subs"].is_null(), "caps are permissions only: {r}");
    for ch in ["chat:cap1", "chat:w9"] {
        let r = c.call(json!({ "subscribe": { "channel": ch } })).await;
        assert!(r["subscribe"].is_object(), "{ch}: {r}");
    }
    let r = c.call(json!({ "subscribe": { "channel": "chat:other" } })).await;
    assert_eq!(r["error"]["code"], 103, "{r}");
    let r = c.call(json!({ "publish": { "channel": "chat:w9", "data": 1 } })).await;
    assert!(r["publish"].is_object(), "pub cap: {r}");
    let r = c.call(json!({ "publish": { "channel": "chat:cap1", "data": 1 } })).await;
    assert_eq!(r["error"]["code"], 103, "sub only: {r}");
    // A regex match is refused at connect.
    let claims = json!({ "sub": "u1", "exp": now + 3600, "caps": [{ "channels": ["^a$"], "allow": ["sub"], "match": "regex" }] });
    let mut c = Cf::dial(&srv, "").await;
    c.send(vec![json!({ "connect": { "token": hs256_token(&claims) } })]).await;
    assert_eq!(c.closed().await, Some(3500));
}

#[tokio::test]
async fn the_personal_channel_is_subscribed_on_both_endpoints() {
    let srv = TestServer::start_with(|c| c.personal.subscribe = true).await;
    // Centrifugo: a server-side subscription, acked (the `user` namespace).
    let mut cf = Cf::dev(&srv, "u7").await;
    // /ws: a `subscribed` frame first.
    let mut ws = srv.connect("u7").await;
    let first = next_frame(&mut ws).await;
    assert_eq!((first.kind.as_str(), first.channel.as_deref()), ("subscribed", Some("user:u7")), "{first:?}");
    assert_eq!(first.cursor, Some(0), "acked: its cursor: {first:?}");
    srv.publish("user:u7", json!({ "n": 1 })).await;
    let m = next_message(&mut ws).await;
    assert_eq!((m.channel.as_deref(), m.seq), (Some("user:u7"), Some(1)));
    let p = cf.publication().await;
    assert_eq!((p["channel"].clone(), p["pub"]["offset"].clone()), (json!("user:u7"), json!(1)));
    // Acked through it: the /ws ack moves this device's cursor.
    let r = ws.request(json!({ "type": "ack", "channel": "user:u7", "seq": 1 })).await.unwrap();
    assert_eq!(r.kind, "ok", "{r:?}");
}
