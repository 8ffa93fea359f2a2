//! Presence leases and the room lifecycle, through real sockets and the HTTP
//! API. Lease TTLs are short (about a second) so expiry is tested for real;
//! every wait is bounded.

use std::time::{Duration, Instant};

use herald_client::Connection;
use herald_proto::MessageView;
use herald_test_support::*;
use serde_json::{json, Value};

/// A server with short leases: TTL `ttl`, renewals every ttl/3, sweeps
/// every 100 ms.
async fn server(ttl: Duration) -> TestServer {
    TestServer::start_with(|c| {
        c.presence.member_lease_ttl = ttl;
        c.presence.sweep_interval = Duration::from_millis(100);
    })
    .await
}

async fn create_room(srv: &TestServer, room: &str, host: &str, grace_secs: u64) -> Resp {
    let r = srv
        .call(
            "PUT",
            &format!("/api/v1/rooms/{room}"),
            Some(json!({ "host": host, "attributes": { "title": "t" }, "grace_period": grace_secs })),
            &[],
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    r
}

async fn room(srv: &TestServer, room: &str) -> Value {
    let r = srv.get(&format!("/api/v1/rooms/{room}")).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.body
}

/// Subscribe as a new presence member and read its own `join`; returns
/// the `ok` reply.
async fn join(conn: &mut Connection, channel: &str, client_id: &str) -> MessageView {
    let ok = rejoin(conn, channel, client_id).await;
    // A member that joined just before may have its `join` fanned out after
    // this connection registered: other members' joins may come first.
    loop {
        let ev = next_presence_event(conn).await;
        let member = ev.member.expect("a presence event names its member").client_id;
        assert_eq!(ev.kind, "join", "only joins before our own: {member}");
        if member == client_id {
            return ok;
        }
    }
}

/// Subscribe as a presence member that may already be present (no `join`
/// is expected).
async fn rejoin(conn: &mut Connection, channel: &str, client_id: &str) -> MessageView {
    let ok = conn
        .request(json!({ "type": "subscribe", "channel": channel, "client_id": client_id, "info": { "name": client_id } }))
        .await
        .expect("subscribe");
    assert_eq!(ok.kind, "ok", "{ok:?}");
    assert_eq!(ok.client_id.as_deref(), Some(client_id));
    ok
}

/// The next frame that is not a `room` event or an app message.
async fn next_presence_event(conn: &mut Connection) -> MessageView {
    loop {
        let f = next_frame(conn).await;
        if f.kind == "join" || f.kind == "leave" {
            return f;
        }
    }
}

/// The next `room` event.
async fn next_room_event(conn: &mut Connection) -> Value {
    loop {
        let f = next_frame(conn).await;
        if f.kind == "room" {
            return serde_json::from_str(f.data.expect("room events have data").get()).unwrap();
        }
    }
}

/// No `join`/`leave` frame within `d` (other frames are skipped).
async fn assert_no_presence_event(conn: &mut Connection, d: Duration) {
    let deadline = tokio::time::Instant::now() + d;
    while let Ok(r) = tokio::time::timeout_at(deadline, conn.next_frame()).await {
        if let Ok(Some(herald_client::ServerEvent::Frame(f))) = r {
            assert!(f.kind != "join" && f.kind != "leave", "unexpected presence event {f:?}");
        } else {
            panic!("connection ended: {r:?}");
        }
    }
}

async fn wait_state(srv: &TestServer, name: &str, state: &str) {
    assert_eventually(&format!("room {name} is {state}"), || async {
        room(srv, name).await["state"] == state
    })
    .await;
}

#[tokio::test]
async fn join_and_leave_are_pushed_and_a_clean_close_leaves_at_once() {
    // A long TTL: only a clean leave can be this fast.
    let srv = server(Duration::from_secs(30)).await;
    create_room(&srv, "room:p1", "host", 60).await;
    let mut alice = srv.connect("alice").await;
    join(&mut alice, "room:p1", "a1").await;
    let mut bob = srv.connect("bob").await;
    join(&mut bob, "room:p1", "b1").await;

    let j = next_presence_event(&mut alice).await;
    assert_eq!(j.kind, "join");
    let m = j.member.unwrap();
    assert_eq!((m.user.as_str(), m.client_id.as_str()), ("bob", "b1"));
    assert_eq!(m.info, Some(json!({ "name": "b1" })));

    let list = alice.request(json!({ "type": "presence", "channel": "room:p1" })).await.unwrap();
    assert_eq!(list.count, Some(2));
    let mut users: Vec<String> = list.members.unwrap().into_iter().map(|m| m.user).collect();
    users.sort();
    assert_eq!(users, ["alice", "bob"]);
    let r = srv.get("/api/v1/channels/room:p1/presence?count=1").await;
    assert_eq!(r.body, json!({ "channel": "room:p1", "count": 2 }));

    let started = Instant::now();
    bob.close(Some(1000), "bye").await.unwrap();
    let l = next_presence_event(&mut alice).await;
    assert_eq!((l.kind.as_str(), l.member.unwrap().client_id.as_str()), ("leave", "b1"));
    assert!(started.elapsed() < Duration::from_secs(10), "a clean close leaves at once, not at lease expiry");
    assert_eq!(srv.get("/api/v1/channels/room:p1/presence").await.body["count"], 1);

    // Unsubscribe is a clean leave too.
    let mut carol = srv.connect("carol").await;
    join(&mut carol, "room:p1", "c1").await;
    assert_eq!(next_presence_event(&mut alice).await.kind, "join");
    assert_eq!(carol.unsubscribe("room:p1").await.unwrap().kind, "ok");
    assert_eq!(next_presence_event(&mut alice).await.kind, "leave");
}

#[tokio::test]
async fn a_vanished_client_leaves_within_the_ttl_plus_one_heartbeat() {
    let ttl = Duration::from_millis(1500);
    let srv = server(ttl).await;
    create_room(&srv, "room:p2", "host", 60).await;
    let mut alice = srv.connect("alice").await;
    join(&mut alice, "room:p2", "a1").await;
    let mut bob = srv.connect("bob").await;
    join(&mut bob, "room:p2", "b1").await;
    assert_eq!(next_presence_event(&mut alice).await.kind, "join");

    // Dropped without a close frame: the lease has to run out.
    let dropped = Instant::now();
    drop(bob);
    let l = next_presence_event(&mut alice).await;
    let after = dropped.elapsed();
    assert_eq!((l.kind.as_str(), l.member.unwrap().user.as_str()), ("leave", "bob"));
    let heartbeat = ttl / 3;
    assert!(after >= ttl - heartbeat - Duration::from_millis(100), "left by expiry, not at once ({after:?})");
    assert!(
        after <= ttl + heartbeat + Duration::from_secs(1),
        "expired within TTL + one heartbeat ({after:?})"
    );
    let m = srv.get("/metrics").await;
    assert!(m.body.as_str().unwrap().contains("herald_presence_expired_total 1"), "expiry is counted");
}

#[tokio::test]
async fn a_client_back_within_the_ttl_keeps_its_membership() {
    let ttl = Duration::from_secs(3);
    let srv = server(ttl).await;
    create_room(&srv, "room:p3", "host", 60).await;
    let mut alice = srv.connect("alice").await;
    join(&mut alice, "room:p3", "a1").await;
    let mut bob = srv.connect("bob").await;
    join(&mut bob, "room:p3", "b1").await;
    assert_eq!(next_presence_event(&mut alice).await.kind, "join");

    drop(bob); // network blip
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut bob = srv.connect("bob").await;
    rejoin(&mut bob, "room:p3", "b1").await;
    // Neither a leave nor a second join, for longer than the old lease.
    assert_no_presence_event(&mut alice, ttl + Duration::from_secs(1)).await;
    assert_eq!(srv.get("/api/v1/channels/room:p3/presence").await.body["count"], 2);
}

#[tokio::test]
async fn writes_with_a_stale_fencing_token_have_no_effect() {
    let srv = server(Duration::from_secs(30)).await;
    create_room(&srv, "room:p4", "host", 60).await;
    let mut alice = srv.connect("alice").await;
    join(&mut alice, "room:p4", "a1").await;
    let mut old = srv.connect("bob").await;
    join(&mut old, "room:p4", "b1").await;
    assert_eq!(next_presence_event(&mut alice).await.kind, "join");

    // The same client through a second connection takes the lease over (a
    // newer token). The old connection's clean leave carries the old token.
    let mut new = srv.connect("bob").await;
    rejoin(&mut new, "room:p4", "b1").await;
    old.close(Some(1000), "old tab").await.unwrap();
    assert_no_presence_event(&mut alice, Duration::from_secs(1)).await;
    let members = srv.get("/api/v1/channels/room:p4/presence").await.body;
    assert_eq!(members["count"], 2, "the stale leave did not remove the member: {members}");

    // Another user cannot take bob's member by naming its client id.
    let mut mallory = srv.connect("mallory").await;
    join(&mut mallory, "room:p4", "b1").await;
    assert_eq!(next_presence_event(&mut alice).await.member.unwrap().user, "mallory");

    new.close(Some(1000), "done").await.unwrap();
    let l = next_presence_event(&mut alice).await;
    assert_eq!((l.kind.as_str(), l.member.unwrap().user.as_str()), ("leave", "bob"));
}

#[tokio::test]
async fn host_drop_grace_then_host_back_is_live_again() {
    let ttl = Duration::from_millis(900);
    let srv = server(ttl).await;
    create_room(&srv, "room:h1", "host", 30).await;
    assert_eq!(room(&srv, "room:h1").await["state"], "open");
    let mut watcher = srv.connect("watcher").await;
    watcher.subscribe("room:h1", Some((0, ""))).await.unwrap();
    assert_eq!(next_room_event(&mut watcher).await["state"], "open");

    let mut host = srv.connect("host").await;
    join(&mut host, "room:h1", "h").await;
    assert_eq!(next_room_event(&mut watcher).await["state"], "live");
    assert_eq!(room(&srv, "room:h1").await["state"], "live");

    drop(host); // the host's network drops: no close frame
    let grace = next_room_event(&mut watcher).await;
    assert_eq!((grace["state"].as_str(), grace["reason"].as_str()), (Some("grace"), Some("host_left")));
    assert!(grace["grace_until_ms"].as_u64().is_some());

    let mut host = srv.connect("host").await;
    join(&mut host, "room:h1", "h2").await;
    let back = next_room_event(&mut watcher).await;
    assert_eq!((back["state"].as_str(), back["reason"].as_str()), (Some("live"), Some("host_joined")));
    let r = room(&srv, "room:h1").await;
    assert_eq!((r["state"].as_str(), r["version"].as_u64()), (Some("live"), Some(4)));
}

#[tokio::test]
async fn grace_runs_out_then_the_room_closes_and_members_are_unsubscribed() {
    let srv = server(Duration::from_secs(30)).await;
    create_room(&srv, "room:h2", "host", 1).await;
    let mut member = srv.connect("member").await;
    join(&mut member, "room:h2", "m").await;
    let mut host = srv.connect("host").await;
    join(&mut host, "room:h2", "h").await;
    wait_state(&srv, "room:h2", "live").await;
    srv.publish("room:h2", json!("hello")).await;

    host.close(Some(1000), "host leaves").await.unwrap();
    // grace (1 s), then closed: the member gets the final event, then is
    // unsubscribed, with the connection still open.
    let mut states = Vec::new();
    let unsubscribed = loop {
        let f = next_frame(&mut member).await;
        match f.kind.as_str() {
            "room" => {
                states.push(serde_json::from_str::<Value>(f.data.unwrap().get()).unwrap()["state"].clone())
            }
            "unsubscribed" => break f,
            _ => {}
        }
    };
    assert_eq!(states.last(), Some(&json!("closed")), "{states:?}");
    assert!(states.contains(&json!("grace")), "{states:?}");
    assert_eq!(
        (unsubscribed.channel.as_deref(), unsubscribed.reason.as_deref()),
        (Some("room:h2"), Some("room_closed"))
    );
    assert_eq!(member.ping().await.unwrap().kind, "pong", "the connection stays up");

    let r = srv.publish("room:h2", json!("late")).await;
    assert_eq!((r.status, r.code()), (410, "channel_closed"));
    let p = member.publish("room:h2", &json!("late"), None).await.unwrap();
    assert_eq!(p.code, Some(json!("channel_closed")));
    assert_eq!(srv.get("/api/v1/channels/room:h2/presence").await.body["count"], 0, "presence cleared");
    assert_eq!(room(&srv, "room:h2").await["state"], "closed");

    // A late subscriber resuming gets what it missed, the final event, and
    // is unsubscribed.
    let mut late = srv.connect("late").await;
    let ok = late.subscribe("room:h2", Some((0, ""))).await.unwrap();
    assert_eq!(ok.kind, "ok");
    let mut kinds = Vec::new();
    loop {
        let f = next_frame(&mut late).await;
        kinds.push(f.kind.clone());
        if f.kind == "unsubscribed" {
            break;
        }
    }
    assert_eq!(kinds.first().map(String::as_str), Some("room"));
    assert!(kinds.contains(&"message".to_owned()));
    assert_eq!(kinds[kinds.len() - 2], "room", "the final event comes right before the unsubscribe");
}

#[tokio::test]
async fn stale_if_match_is_412_and_illegal_transitions_are_409() {
    let srv = server(Duration::from_secs(30)).await;
    let created = create_room(&srv, "room:c1", "host", 60).await;
    assert_eq!(created.headers["etag"], "\"1\"");
    assert_eq!(created.body["version"], 1);
    let again = srv.call("PUT", "/api/v1/rooms/room:c1", Some(json!({ "host": "x" })), &[]).await;
    assert_eq!((again.status, again.code()), (409, "conflict"));
    assert_eq!(again.body["current"]["version"], 1);

    let ok = srv
        .call(
            "PATCH",
            "/api/v1/rooms/room:c1",
            Some(json!({ "attributes": { "a": 1 } })),
            &[("If-Match", "\"1\"")],
        )
        .await;
    assert_eq!((ok.status, ok.headers["etag"].to_str().unwrap()), (200, "\"2\""));
    assert_eq!(ok.body["attributes"], json!({ "a": 1 }));

    let stale = srv
        .call("PATCH", "/api/v1/rooms/room:c1", Some(json!({ "attributes": {} })), &[("If-Match", "\"1\"")])
        .await;
    assert_eq!((stale.status, stale.code()), (412, "precondition_failed"));
    assert!(stale.is_problem());
    assert_eq!(stale.body["current"]["version"], 2);

    let illegal = srv.call("PATCH", "/api/v1/rooms/room:c1", Some(json!({ "state": "grace" })), &[]).await;
    assert_eq!((illegal.status, illegal.code()), (409, "conflict"), "open -> grace");
    assert_eq!(illegal.body["current"]["state"], "open");

    let closed = srv.call("DELETE", "/api/v1/rooms/room:c1", None, &[("If-Match", "\"2\"")]).await;
    assert_eq!((closed.status, closed.body["state"].as_str()), (200, Some("closed")));
    for (method, body) in [("PATCH", Some(json!({ "state": "live" }))), ("DELETE", None)] {
        let r = srv.call(method, "/api/v1/rooms/room:c1", body, &[]).await;
        assert_eq!((r.status, r.code()), (409, "conflict"), "{method} of a closed room");
    }
    let missing = srv.call("PATCH", "/api/v1/rooms/room:none", Some(json!({ "state": "live" })), &[]).await;
    assert_eq!(missing.status, 404);
    let not_room = srv.call("PUT", "/api/v1/rooms/chat:x", Some(json!({ "host": "h" })), &[]).await;
    assert_eq!(not_room.code(), "not_supported");
    let mut c = srv.connect("u").await;
    let e = c.subscribe("room:none", None).await.unwrap();
    assert_eq!(e.code, Some(json!("not_found")), "rooms must be created before use");
}

#[tokio::test]
async fn concurrent_cas_writers_form_a_single_chain_of_versions() {
    let srv = std::sync::Arc::new(server(Duration::from_secs(30)).await);
    create_room(&srv, "room:cas", "host", 60).await;
    let writers: Vec<_> = (0..50)
        .map(|i| {
            let srv = srv.clone();
            tokio::spawn(async move {
                // Read, then write with If-Match; retry on 412. Bounded.
                for _ in 0..500 {
                    let v = room(&srv, "room:cas").await["version"].as_u64().unwrap();
                    let r = srv
                        .call(
                            "PATCH",
                            "/api/v1/rooms/room:cas",
                            Some(json!({ "attributes": { "writer": i } })),
                            &[("If-Match", &format!("\"{v}\""))],
                        )
                        .await;
                    match r.status {
                        200 => {
                            let new = r.body["version"].as_u64().unwrap();
                            assert_eq!(new, v + 1, "a success writes exactly the next version");
                            return (v, i);
                        }
                        412 => continue,
                        s => panic!("unexpected {s}: {:?}", r.body),
                    }
                }
                panic!("writer {i} never succeeded");
            })
        })
        .collect();
    let mut from_versions = Vec::new();
    for w in writers {
        from_versions.push(w.await.unwrap().0);
    }
    from_versions.sort_unstable();
    assert_eq!(from_versions, (1..=50).collect::<Vec<u64>>(), "no two successes from the same version");

    // The log holds one room event per version, in order.
    let versions: Vec<u64> = srv
        .history("room:cas")
        .await
        .iter()
        .filter(|m| m["type"] == "room")
        .map(|m| m["data"]["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, (1..=51).collect::<Vec<u64>>());
}

#[tokio::test]
async fn room_events_are_logged_in_order_with_messages_and_recovered_on_resume() {
    let srv = server(Duration::from_secs(30)).await;
    create_room(&srv, "room:log", "host", 60).await;
    srv.publish("room:log", json!("m1")).await;
    let mut host = srv.connect("host").await;
    join(&mut host, "room:log", "h").await;
    wait_state(&srv, "room:log", "live").await;
    srv.publish("room:log", json!("m2")).await;
    assert_eq!(srv.call("DELETE", "/api/v1/rooms/room:log", None, &[]).await.status, 200);

    let log = srv.history("room:log").await;
    let kinds: Vec<(&str, u64)> =
        log.iter().map(|m| (m["type"].as_str().unwrap(), m["seq"].as_u64().unwrap())).collect();
    assert_eq!(kinds, [("room", 1), ("message", 2), ("room", 3), ("message", 4), ("room", 5)]);
    let states: Vec<&str> = log.iter().filter_map(|m| m["data"]["state"].as_str()).collect();
    assert_eq!(states, ["open", "live", "closed"]);

    // A client that saw seq 2 resumes: the rest, in order, then unsubscribed.
    let mut c = srv.connect("reader").await;
    let ok = c.subscribe("room:log", Some((2, ""))).await.unwrap();
    assert_eq!(ok.kind, "ok");
    let mut got = Vec::new();
    loop {
        let f = next_frame(&mut c).await;
        if f.kind == "unsubscribed" {
            break;
        }
        got.push((f.kind.clone(), f.seq.unwrap()));
    }
    assert_eq!(got, [("room".to_owned(), 3), ("message".to_owned(), 4), ("room".to_owned(), 5)]);
}

#[tokio::test]
async fn grace_timers_survive_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let tweak = |c: &mut herald_server::Config| {
        c.presence.member_lease_ttl = Duration::from_secs(1);
        c.presence.sweep_interval = Duration::from_millis(100);
    };
    let srv = TestServer::start_in(dir.clone(), tweak).await;
    create_room(&srv, "room:r1", "host", 2).await;
    let mut host = srv.connect("host").await;
    join(&mut host, "room:r1", "h").await;
    wait_state(&srv, "room:r1", "live").await;
    // Shutdown closes the host's socket cleanly: the room enters grace now,
    // and the grace deadline is stored.
    srv.stop().await;
    drop(host);

    let srv = TestServer::start_in(dir, tweak).await;
    let r = room(&srv, "room:r1").await;
    assert_eq!(r["state"], "grace", "{r}");
    wait_state(&srv, "room:r1", "closed").await;
    let r = room(&srv, "room:r1").await;
    assert!(r["updated_at_ms"].as_u64().unwrap() >= r["created_at_ms"].as_u64().unwrap() + 2000);
}
