//! Frame size, bad frames, connection cap, pings.

use herald_client::{ConnectOptions, Connection};
use herald_test_support::*;
use serde_json::json;

#[tokio::test]
async fn oversize_frame_closes_with_1009() {
    let srv = TestServer::start_with(|c| c.websocket.max_message_bytes = 4096).await;
    let mut c = srv.connect("big").await;
    let big = format!(r#"{{"type":"publish","req":1,"channel":"chat:big","data":"{}"}}"#, "x".repeat(8192));
    c.send_raw(&big).await.unwrap();
    let (_frames, code) = read_until_closed(&mut c).await;
    assert_eq!(code, Some(1009));
    assert!(srv.history("chat:big").await.is_empty());
    // The server is fine afterwards.
    let mut d = srv.connect("ok").await;
    assert_eq!(d.ping().await.unwrap().kind, "pong");
}

#[tokio::test]
async fn bad_frames_get_error_frames_with_stable_codes() {
    let srv = TestServer::start().await;
    let mut c = srv.connect("u").await;
    c.send_raw("{nope").await.unwrap();
    let f = next_frame(&mut c).await;
    assert_eq!((f.kind.as_str(), f.code.clone()), ("error", Some(json!("bad_json"))));
    let f = c.request(json!({ "type": "subscribe", "channel": "bad name" })).await.unwrap();
    assert_eq!(f.code, Some(json!("bad_channel")));
    let f = c.request(json!({ "type": "subscribe", "channel": "nons:1" })).await.unwrap();
    assert_eq!(f.code, Some(json!("unknown_namespace")));
    let f = c.request(json!({ "type": "warp" })).await.unwrap();
    assert_eq!(f.code, Some(json!("bad_request")));
    assert_eq!(c.subscribe("chat:d", None).await.unwrap().kind, "ok");
    let f = c.subscribe("chat:d", None).await.unwrap();
    assert_eq!(f.code, Some(json!("already_subscribed")));
    let f = c.unsubscribe("chat:nope").await.unwrap();
    assert_eq!(f.code, Some(json!("not_subscribed")));
    assert_eq!(c.unsubscribe("chat:d").await.unwrap().kind, "ok");
    let f = c.publish("user:u", &json!(1), None).await.unwrap();
    assert_eq!(f.code, Some(json!("forbidden")), "user: is API-publish only");
    let f = c.request(json!({ "type": "ack", "channel": "chat:d", "seq": 1 })).await.unwrap();
    assert_eq!(f.code, Some(json!("not_subscribed")));
    let f = c.request(json!({ "type": "presence", "channel": "chat:d" })).await.unwrap();
    assert_eq!(f.code, Some(json!("not_supported")), "chat has no presence");
    let f = c.request(json!({ "type": "presence", "channel": "room:r" })).await.unwrap();
    assert_eq!(f.code, Some(json!("not_found")), "rooms must exist");
}

#[tokio::test]
async fn unsubscribed_channels_stop_delivering() {
    let srv = TestServer::start().await;
    let mut c = srv.connect("u").await;
    c.subscribe("chat:u1", None).await.unwrap();
    srv.publish("chat:u1", json!(1)).await;
    assert_eq!(seqs(&next_messages(&mut c, 1).await), vec![1]);
    c.unsubscribe("chat:u1").await.unwrap();
    srv.publish("chat:u1", json!(2)).await;
    assert_silent(&mut c, std::time::Duration::from_millis(200)).await;
    assert_eq!(srv.state.hub.subscriber_count(&herald_proto::ChannelName::new("chat:u1").unwrap()), 0);
}

#[tokio::test]
async fn upgrades_above_the_connection_cap_get_503() {
    let srv = TestServer::start_with(|c| c.websocket.max_connections = 2).await;
    let mut a = srv.connect("a").await;
    let _b = srv.connect("b").await;
    let Err(err) = Connection::connect(&ConnectOptions::dev_user(&srv.url, "c")).await else {
        panic!("a third connection must be refused")
    };
    assert_eq!((err.http_status(), err.code()), (Some(503), Some("too_many_connections")));
    a.close(None, "").await.unwrap();
    drop(a);
    let url = srv.url.clone();
    assert_eventually("a slot frees up", || {
        let url = url.clone();
        async move { Connection::connect(&ConnectOptions::dev_user(&url, "c")).await.is_ok() }
    })
    .await;
}

#[tokio::test]
async fn cleanup_runs_when_the_socket_just_drops() {
    let srv = TestServer::start().await;
    let ch = herald_proto::ChannelName::new("chat:gone").unwrap();
    {
        let mut c = srv.connect("u").await;
        c.subscribe("chat:gone", None).await.unwrap();
        assert_eq!(srv.state.hub.subscriber_count(&ch), 1);
        // Dropped without a close frame.
    }
    let state = srv.state.clone();
    assert_eventually("hub entry removed", || {
        let (state, ch) = (state.clone(), ch.clone());
        async move { state.hub.subscriber_count(&ch) == 0 }
    })
    .await;
}
