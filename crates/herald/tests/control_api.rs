//! The backend's actions on users on one node (the embedded engine),
//! through real sockets on both protocols: the connection listing,
//! disconnect (reconnect or not), bans refused before the upgrade,
//! revocations (kept across a restart), server-side subscribe and
//! unsubscribe told on the wire, a room's member removal, the channel and
//! node lists, and the problems of bad input. The same across two nodes on
//! Redis: `multi_node/control_across_nodes.rs`.

#[path = "common/centrifugo.rs"]
mod centrifugo;

use centrifugo::Cf;
use herald_client::{ClientError, ConnectOptions, Connection};
use herald_test_support::*;
use serde_json::{json, Value};

async fn ws(srv: &TestServer, user: &str, device: &str) -> Connection {
    Connection::connect(&ConnectOptions::dev_user(&srv.url, user).with_device(device)).await.expect("connect")
}

/// The close of a `/ws` connection: the `disconnect` frame's code and
/// `reconnect`, and the close code.
async fn closed(conn: &mut Connection) -> (Option<u64>, Option<bool>, Option<u16>) {
    let (frames, code) = read_until_closed(conn).await;
    let d = frames.iter().find(|f| f.kind == "disconnect").expect("a disconnect frame");
    (d.code.as_ref().and_then(Value::as_u64), d.reconnect, code)
}

/// The next frame of `kind`, skipping pongs and others.
async fn frame_of(conn: &mut Connection, kind: &str) -> herald_proto::MessageView {
    loop {
        let f = next_frame(conn).await;
        if f.kind == kind {
            return f;
        }
    }
}

#[tokio::test]
async fn connections_of_a_user_are_listed_with_their_subscriptions() {
    let srv = TestServer::start().await;
    let mut phone = ws(&srv, "ann", "phone").await;
    phone.subscribe("chat:a", None).await.unwrap();
    let _laptop = ws(&srv, "ann", "laptop").await;
    let (_cf, r) = Cf::connect(srv.addr, "ann", "tablet").await;
    assert!(r["connect"]["client"].is_string(), "{r}");
    let _other = ws(&srv, "bob", "phone").await;

    let Resp { status, body, .. } = srv.get("/api/v1/users/ann/connections").await;
    assert_eq!(status, 200, "{body}");
    let list = body["connections"].as_array().unwrap();
    assert_eq!(list.len(), 3, "{body}");
    let node = srv.get("/api/v1/nodes").await.body["nodes"][0]["id"].as_str().unwrap().to_owned();
    for c in list {
        assert_eq!(c["node"], json!(node));
        assert!(c["id"].as_str().unwrap().starts_with(&format!("{node}/")));
        assert!(c["connected_at_ms"].as_u64().unwrap() > 0);
    }
    let by_device = |d: &str| list.iter().find(|c| c["device"] == json!(d)).unwrap().clone();
    assert_eq!(by_device("phone")["protocol"], "herald");
    assert_eq!(by_device("phone")["subscriptions"], json!(["chat:a"]));
    assert_eq!(by_device("tablet")["protocol"], "centrifugo");
    assert_eq!(srv.get("/api/v1/users/nobody/connections").await.body["connections"], json!([]));
}

#[tokio::test]
async fn a_disconnect_closes_every_connection_of_the_user_with_a_reconnect_code() {
    let srv = TestServer::start().await;
    let mut a = ws(&srv, "u1", "a").await;
    let mut b = ws(&srv, "u1", "b").await;
    let (mut cf, _) = Cf::connect(srv.addr, "u1", "c").await;
    let mut other = ws(&srv, "u2", "a").await;

    let r = srv
        .call(
            "POST",
            "/api/v1/users/u1/disconnect",
            Some(json!({"reconnect": true, "reason": "re-login"})),
            &[],
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(closed(&mut a).await, (Some(4011), Some(true), Some(4011)));
    assert_eq!(closed(&mut b).await, (Some(4011), Some(true), Some(4011)));
    assert_eq!(cf.closed().await, Some(3011), "Centrifugo's force-reconnect code");
    // Another user is untouched, and the user may connect again at once.
    other.ping().await.expect("still open");
    let mut again = ws(&srv, "u1", "a").await;
    again.ping().await.expect("reconnected");
    // Retried: one effect on what was there (nothing), the new one closes.
    let r = srv.call("POST", "/api/v1/users/u1/disconnect", Some(json!({"reconnect": true})), &[]).await;
    assert_eq!(r.status, 202);
    assert_eq!(closed(&mut again).await.2, Some(4011));
    assert!(srv
        .get("/metrics")
        .await
        .body
        .as_str()
        .unwrap()
        .contains("herald_control_actions_total{action=\"disconnect\"} 2"));
}

#[tokio::test]
async fn one_device_or_one_connection_is_disconnected_alone() {
    let srv = TestServer::start().await;
    let mut phone = ws(&srv, "u3", "phone").await;
    let mut laptop = ws(&srv, "u3", "laptop").await;
    let r = srv
        .call(
            "POST",
            "/api/v1/users/u3/disconnect",
            Some(json!({"device": "phone", "reconnect": false})),
            &[],
        )
        .await;
    assert_eq!(r.status, 202);
    assert_eq!(closed(&mut phone).await, (Some(4012), Some(false), Some(4012)));
    laptop.ping().await.expect("the other device stays");

    let list = srv.get("/api/v1/users/u3/connections").await.body;
    let id = list["connections"][0]["id"].as_str().unwrap().to_owned();
    let r = srv
        .call("POST", "/api/v1/users/u3/disconnect", Some(json!({"connection": id, "reconnect": true})), &[])
        .await;
    assert_eq!(r.status, 202);
    assert_eq!(closed(&mut laptop).await.2, Some(4011));
}

#[tokio::test]
async fn a_ban_refuses_the_user_before_the_upgrade_until_it_ends() {
    let srv = TestServer::start().await;
    let mut a = ws(&srv, "bad", "a").await;
    let (mut cf, _) = Cf::connect(srv.addr, "bad", "c").await;
    let r = srv
        .call(
            "POST",
            "/api/v1/users/bad/disconnect",
            Some(json!({"reconnect": false, "ban_seconds": 60})),
            &[],
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert!(r.body["banned_until_ms"].as_u64().unwrap() > herald_test_support::now_secs() * 1000);
    assert_eq!(closed(&mut a).await, (Some(4012), Some(false), Some(4012)));
    assert_eq!(cf.closed().await, Some(3503), "Centrifugo's force-no-reconnect code");

    // Refused before the upgrade, with the stable code.
    match Connection::connect(&ConnectOptions::dev_user(&srv.url, "bad")).await {
        Err(ClientError::Rejected { status: 403, code: Some(code), .. }) => assert_eq!(code, "banned"),
        other => panic!("expected a 403 banned, got {other:?}"),
    }
    let (mut cf, r) = Cf::connect(srv.addr, "bad", "c").await;
    assert!(r.is_null(), "closed instead of connected: {r}");
    assert_eq!(cf.closed().await, Some(3503));
    // Other users are not.
    ws(&srv, "good", "a").await.ping().await.unwrap();

    // A device ban holds for that device only, and ends.
    let r = srv
        .call(
            "POST",
            "/api/v1/users/dev/disconnect",
            Some(json!({"device": "old", "reconnect": false, "ban_seconds": 1})),
            &[],
        )
        .await;
    assert_eq!(r.status, 202);
    assert!(Connection::connect(&ConnectOptions::dev_user(&srv.url, "dev").with_device("old"))
        .await
        .is_err());
    ws(&srv, "dev", "new").await.ping().await.unwrap();
    assert_eventually("the ban ends", || async {
        Connection::connect(&ConnectOptions::dev_user(&srv.url, "dev").with_device("old")).await.is_ok()
    })
    .await;
}

fn token_issued(sub: &str, iat: u64) -> String {
    hs256_token(&json!({ "sub": sub, "channels": ["chat:*"], "exp": now_secs() + 600, "iat": iat }))
}

#[tokio::test]
async fn a_revoke_closes_old_tokens_as_expired_admits_fresh_ones_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let srv = TestServer::start_in(dir.path().to_path_buf(), |_| {}).await;
    let old = token_issued("rev", now_secs() - 100);
    let mut a = Connection::connect(&ConnectOptions::token(&srv.url, &old)).await.unwrap();
    let mut other =
        Connection::connect(&ConnectOptions::token(&srv.url, token_issued("keep", now_secs() - 100)))
            .await
            .unwrap();
    let before = now_secs() * 1000 - 10_000;
    let r =
        srv.call("POST", "/api/v1/users/rev/revoke", Some(json!({"issued_before_ms": before})), &[]).await;
    assert_eq!((r.status, r.body["issued_before_ms"].as_u64()), (202, Some(before)), "{}", r.body);
    let (_, reconnect, code) = closed(&mut a).await;
    assert_eq!((reconnect, code), (Some(true), Some(4003)), "closed as expired");
    other.ping().await.expect("another user's connection stays");

    match Connection::connect(&ConnectOptions::token(&srv.url, &old)).await {
        Err(ClientError::Rejected { status: 401, code: Some(code), .. }) => assert_eq!(code, "token_expired"),
        other => panic!("expected 401 token_expired, got {other:?}"),
    }
    let fresh = token_issued("rev", now_secs());
    Connection::connect(&ConnectOptions::token(&srv.url, &fresh))
        .await
        .expect("a fresh token")
        .ping()
        .await
        .unwrap();
    // An earlier revoke changes nothing (the later time holds).
    let r = srv
        .call("POST", "/api/v1/users/rev/revoke", Some(json!({"issued_before_ms": before - 50_000})), &[])
        .await;
    assert_eq!(r.body["issued_before_ms"].as_u64(), Some(before));

    drop(a);
    drop(other);
    srv.stop().await;
    let srv = TestServer::start_in(dir.path().to_path_buf(), |_| {}).await;
    assert!(
        Connection::connect(&ConnectOptions::token(&srv.url, &old)).await.is_err(),
        "still refused after a restart"
    );
    Connection::connect(&ConnectOptions::token(&srv.url, &fresh))
        .await
        .expect("the fresh one still admitted");
    srv.stop().await;
}

#[tokio::test]
async fn a_server_side_subscribe_delivers_from_its_position_without_a_gap_or_a_double() {
    let srv = TestServer::start().await;
    for n in 1..=3 {
        srv.publish("chat:s", json!(n)).await;
    }
    let mut c = ws(&srv, "sub", "a").await;
    let r = srv
        .call(
            "POST",
            "/api/v1/users/sub/subscriptions",
            Some(json!({"channel": "chat:s", "since": {"seq": 1}})),
            &[],
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    let s = frame_of(&mut c, "subscribed").await;
    assert_eq!(s.channel.as_deref(), Some("chat:s"));
    let got = next_messages(&mut c, 2).await;
    assert_eq!(seqs(&got), [2, 3]);
    // Retried: no second subscription.
    srv.call(
        "POST",
        "/api/v1/users/sub/subscriptions",
        Some(json!({"channel": "chat:s", "since": {"seq": 1}})),
        &[],
    )
    .await;
    srv.publish("chat:s", json!(4)).await;
    assert_eq!(seqs(&next_messages(&mut c, 1).await), [4]);
    let listed = srv.get("/api/v1/users/sub/connections").await.body;
    assert_eq!(listed["connections"][0]["subscriptions"], json!(["chat:s"]));

    // Across a reconnect: subscribed again from the last seq seen.
    c.close(Some(1000), "bye").await.unwrap();
    srv.publish("chat:s", json!(5)).await;
    let mut c = ws(&srv, "sub", "a").await;
    srv.call(
        "POST",
        "/api/v1/users/sub/subscriptions",
        Some(json!({"channel": "chat:s", "since": {"seq": 4}})),
        &[],
    )
    .await;
    frame_of(&mut c, "subscribed").await;
    srv.publish("chat:s", json!(6)).await;
    assert_eq!(seqs(&next_messages(&mut c, 2).await), [5, 6], "nothing missing, nothing twice");

    // Unsubscribed and told; nothing more arrives.
    let r = srv.call("DELETE", "/api/v1/users/sub/subscriptions/chat:s", None, &[]).await;
    assert_eq!(r.status, 202);
    let u = frame_of(&mut c, "unsubscribed").await;
    assert_eq!(u.channel.as_deref(), Some("chat:s"));
    srv.publish("chat:s", json!(7)).await;
    assert_silent(&mut c, std::time::Duration::from_millis(300)).await;
    assert_eq!(
        srv.get("/api/v1/users/sub/connections").await.body["connections"][0]["subscriptions"],
        json!([])
    );
}

#[tokio::test]
async fn the_centrifugo_wire_gets_subscribe_and_unsubscribe_pushes() {
    let srv = TestServer::start().await;
    srv.publish("chat:cf", json!(1)).await;
    let (mut cf, _) = Cf::connect(srv.addr, "cfu", "d").await;
    srv.call(
        "POST",
        "/api/v1/users/cfu/subscriptions",
        Some(json!({"channel": "chat:cf", "since": {"seq": 0}})),
        &[],
    )
    .await;
    let p = cf.push().await;
    assert_eq!(p["channel"], "chat:cf");
    assert_eq!(p["subscribe"]["recoverable"], true, "{p}");
    assert!(p["subscribe"]["epoch"].is_string(), "{p}");
    let p = cf.push().await;
    assert_eq!((p["channel"].as_str(), p["pub"]["offset"].as_u64()), (Some("chat:cf"), Some(1)), "{p}");
    srv.call("DELETE", "/api/v1/users/cfu/subscriptions/chat:cf", None, &[]).await;
    let p = cf.push().await;
    assert_eq!(p["unsubscribe"]["code"], 2000, "stays unsubscribed: {p}");
}

#[tokio::test]
async fn acked_channels_keep_their_inbox_after_an_unsubscribe() {
    let srv = TestServer::start().await;
    let mut c = ws(&srv, "ack", "a").await;
    srv.call("POST", "/api/v1/users/ack/subscriptions", Some(json!({"channel": "user:ack"})), &[]).await;
    frame_of(&mut c, "subscribed").await;
    srv.publish("user:ack", json!("one")).await;
    let m = next_message(&mut c).await;
    c.send(&json!({"type": "ack", "channel": "user:ack", "seq": m.seq})).await.unwrap();
    srv.call("DELETE", "/api/v1/users/ack/subscriptions/user:ack", None, &[]).await;
    frame_of(&mut c, "unsubscribed").await;
    srv.publish("user:ack", json!("two")).await;
    let inbox = srv.get("/api/v1/users/ack/inbox").await.body;
    let entry = inbox["channels"].as_array().and_then(|l| l.first()).cloned().unwrap_or(Value::Null);
    assert_eq!(entry["channel"], "user:ack", "{inbox}");
    assert_eq!(entry["devices"][0]["cursor"].as_u64(), Some(1), "the cursor kept: {inbox}");
    assert_eq!(entry["devices"][0]["unread"].as_u64(), Some(1), "the inbox kept: {inbox}");
}

#[tokio::test]
async fn a_removed_member_is_unsubscribed_leaves_and_cannot_rejoin() {
    let srv = TestServer::start().await;
    create_room(&srv, "room:r1", "host", 60).await;
    let mut watcher = srv.connect("watcher").await;
    join(&mut watcher, "room:r1", "w").await;
    assert_eq!(next_presence(&mut watcher).await.0, "join");
    let mut speaker = srv.connect("speaker").await;
    join(&mut speaker, "room:r1", "s").await;
    assert_eq!(next_presence(&mut watcher).await, ("join".into(), "speaker".into(), "s".into()));

    let r = srv.call("DELETE", "/api/v1/rooms/room:r1/members/speaker", None, &[]).await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(frame_of(&mut speaker, "unsubscribed").await.channel.as_deref(), Some("room:r1"));
    assert_eq!(next_presence(&mut watcher).await, ("leave".into(), "speaker".into(), "s".into()));
    let room = srv.get("/api/v1/rooms/room:r1").await.body;
    assert_eq!(room["removed"], json!(["speaker"]), "{room}");
    let users: Vec<&str> =
        room["members"].as_array().unwrap().iter().map(|m| m["user"].as_str().unwrap()).collect();
    assert_eq!(users, ["watcher"]);
    // Rejoin refused on the wire, and through the API; a retry is one removal.
    let r = speaker.subscribe("room:r1", None).await.unwrap();
    assert_eq!(
        (r.kind.as_str(), r.code.as_ref().and_then(Value::as_str)),
        ("error", Some("forbidden")),
        "{r:?}"
    );
    let r = srv
        .call("POST", "/api/v1/users/speaker/subscriptions", Some(json!({"channel": "room:r1"})), &[])
        .await;
    assert_eq!((r.status, r.body["code"].as_str()), (403, Some("forbidden")));
    srv.call("DELETE", "/api/v1/rooms/room:r1/members/speaker", None, &[]).await;
    assert_eq!(srv.get("/api/v1/rooms/room:r1").await.body["removed"], json!(["speaker"]));
}

#[tokio::test]
async fn channels_are_listed_with_their_subscribers_by_pattern_and_page() {
    let srv = TestServer::start().await;
    let mut a = srv.connect("la").await;
    let mut b = srv.connect("lb").await;
    for ch in ["chat:1", "chat:2", "live:x"] {
        a.subscribe(ch, None).await.unwrap();
    }
    b.subscribe("chat:2", None).await.unwrap();
    let body = srv.get("/api/v1/channels?pattern=chat:*").await.body;
    assert_eq!(
        body["channels"],
        json!([{"channel": "chat:1", "subscribers": 1}, {"channel": "chat:2", "subscribers": 2}]),
        "{body}"
    );
    assert!(body["next"].is_null());
    let page = srv.get("/api/v1/channels?limit=1").await.body;
    assert_eq!(page["channels"][0]["channel"], "chat:1");
    let next = page["next"].as_str().unwrap();
    let page = srv.get(&format!("/api/v1/channels?limit=1&after={next}")).await.body;
    assert_eq!(page["channels"][0]["channel"], "chat:2");
    let nodes = srv.get("/api/v1/nodes").await.body;
    let node = &nodes["nodes"][0];
    assert_eq!((node["connections"].as_u64(), node["engine"].as_str()), (Some(2), Some("ok")), "{nodes}");
    assert!(node["subscriptions"].as_u64().unwrap() >= 4);
}

#[tokio::test]
async fn bad_users_devices_channels_and_values_are_clear_problems() {
    let srv = TestServer::start().await;
    let cases = [
        (
            "POST",
            "/api/v1/users/u/disconnect",
            json!({"reconnect": true, "ban_seconds": 0}),
            400,
            "bad_request",
        ),
        ("POST", "/api/v1/users/u/disconnect", json!({"reconnect": true, "device": ""}), 400, "bad_request"),
        ("POST", "/api/v1/users/u/disconnect", json!({"ban": 1}), 400, "bad_request"),
        ("POST", "/api/v1/users/u/revoke", json!({"issued_before_ms": 0}), 400, "bad_request"),
        ("POST", "/api/v1/users/u/subscriptions", json!({"channel": "nope:1"}), 404, "unknown_namespace"),
        ("POST", "/api/v1/users/u/subscriptions", json!({"channel": "bad channel"}), 400, "bad_channel"),
        ("POST", "/api/v1/users/u/subscriptions", json!({"channel": "room:none"}), 404, "not_found"),
        (
            "POST",
            "/api/v1/users/u/subscriptions",
            json!({"channel": "live:x", "since": {"seq": 1}}),
            405,
            "not_supported",
        ),
        ("POST", "/api/v1/users/%01/revoke", json!({"issued_before_ms": 1}), 400, "bad_request"),
    ];
    for (method, path, body, status, code) in cases {
        let r = srv.call(method, path, Some(body.clone()), &[]).await;
        assert_eq!((r.status, r.body["code"].as_str()), (status, Some(code)), "{path} {body}: {}", r.body);
    }
    let r = srv.call("DELETE", "/api/v1/rooms/chat:1/members/u", None, &[]).await;
    assert_eq!((r.status, r.body["code"].as_str()), (405, Some("not_supported")));
    let r = srv.get("/api/v1/channels?limit=0").await;
    assert_eq!((r.status, r.body["code"].as_str()), (400, Some("bad_request")));
}

/// The Rust client hands a server-side subscription made from a position
/// over as a `Subscription` that starts after that position.
#[tokio::test]
async fn the_rust_client_takes_a_server_side_subscription_from_its_position() {
    use herald_client::{Client, ClientOptions, Event};
    let srv = TestServer::start().await;
    for n in 1..=3 {
        srv.publish("chat:rc", json!(n)).await;
    }
    let mut opts = ClientOptions::new(ConnectOptions::dev_user(&srv.url, "rc"));
    opts.server_subscriptions = true;
    let client = Client::new(opts);
    assert_eventually("connected", || async {
        srv.get("/api/v1/users/rc/connections").await.body["connections"]
            .as_array()
            .is_some_and(|l| l.len() == 1)
    })
    .await;
    srv.call(
        "POST",
        "/api/v1/users/rc/subscriptions",
        Some(json!({"channel": "chat:rc", "since": {"seq": 1}})),
        &[],
    )
    .await;
    let mut sub =
        tokio::time::timeout(WAIT, client.next_server_subscription()).await.unwrap().expect("handed over");
    assert_eq!(sub.channel().as_str(), "chat:rc");
    let mut seqs = Vec::new();
    while seqs.len() < 2 {
        if let Event::Message(m) = tokio::time::timeout(WAIT, sub.next()).await.unwrap().unwrap().unwrap() {
            seqs.push(m.seq.unwrap());
        }
    }
    assert_eq!(seqs, [2, 3]);
}
