//! User-limited channels (`dm:chat#42,43`, a namespace's
//! `allow_user_limited`): only the listed users subscribe (and list
//! presence), with no token permission needed and whatever the token allows
//! others; the name rules; a namespace without the option treats the name
//! as an ordinary one. The Centrifugo endpoint's side is in
//! `centrifugo_protocol.rs`.

use herald_client::{ConnectOptions, Connection};
use herald_core::{Delivery, NamespaceOptions};
use herald_test_support::*;
use serde_json::json;

/// Subscribe; the reply's error code, if refused.
async fn subscribe(c: &mut Connection, channel: &str) -> Result<(), String> {
    let r = c.subscribe(channel, None).await.expect("a reply");
    match r.kind.as_str() {
        "ok" => Ok(()),
        _ => Err(format!("{} {}", r.code.unwrap_or_default(), r.message.unwrap_or_default())),
    }
}

async fn server() -> TestServer {
    TestServer::start_with(|c| {
        let dm =
            NamespaceOptions { delivery: Delivery::Durable, allow_user_limited: true, ..Default::default() };
        c.namespaces.0.insert("dm".into(), dm);
    })
    .await
}

#[tokio::test]
async fn only_the_listed_users_subscribe() {
    let srv = server().await;
    let channel = "dm:chat#42,43";
    let mut a = srv.connect("42").await;
    let mut b = srv.connect("43").await;
    let mut third = srv.connect("44").await;
    subscribe(&mut a, channel).await.expect("a listed user subscribes");
    subscribe(&mut b, channel).await.expect("the other listed user subscribes");
    // Dev mode allows every channel: the list still decides.
    let refused = subscribe(&mut third, channel).await.unwrap_err();
    assert!(refused.starts_with("\"forbidden\""), "{refused}");
    // The backend publishes to it as to any channel; the listed users get it.
    let r = srv.publish(channel, json!({ "text": "hi" })).await;
    assert_eq!(r.status, 201, "{}", r.body);
    for c in [&mut a, &mut b] {
        let got = next_messages(c, 1).await;
        assert_eq!((got[0].channel.as_deref(), data(&got[0])), (Some(channel), json!({ "text": "hi" })));
    }
}

#[tokio::test]
async fn a_listed_user_needs_no_token_permission() {
    let srv = TestServer::start_with(|c| {
        c.dev = false;
        let dm = NamespaceOptions { allow_user_limited: true, ..Default::default() };
        c.namespaces.0.insert("dm".into(), dm);
    })
    .await;
    // A token that grants nothing but `chat:*`.
    let token = |sub: &str| user_token(sub, &["chat:*"], 3600);
    let mut listed = Connection::connect(&ConnectOptions::token(&srv.url, token("42"))).await.unwrap();
    subscribe(&mut listed, "dm:x#41,42").await.expect("listed: no permission needed");
    let mut other = Connection::connect(&ConnectOptions::token(&srv.url, token("43"))).await.unwrap();
    let refused = subscribe(&mut other, "dm:x#41,42").await.unwrap_err();
    assert!(refused.starts_with("\"forbidden\""), "{refused}");
}

#[tokio::test]
async fn the_name_rules_and_a_namespace_without_the_option() {
    let srv = server().await;
    let mut c = srv.connect("7").await;
    // 16 ids at most, each of letters, digits and _-.@=.
    let sixteen: Vec<String> = (1..=16).map(|i| i.to_string()).collect();
    let ok = format!("dm:big#{}", sixteen.join(","));
    assert_eq!(srv.publish(&ok, json!(1)).await.status, 201);
    let seventeen = format!("{ok},17");
    let r = srv.publish(&seventeen, json!(1)).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body["detail"].as_str().unwrap().contains("user ids"), "{}", r.body);
    for bad in ["dm:x#", "dm:x#1,,2", "dm:x#a:b"] {
        let e = subscribe(&mut c, bad).await.unwrap_err();
        assert!(e.starts_with("\"bad_channel\"") && e.contains("user ids"), "{bad}: {e}");
    }
    // `chat` does not allow user-limited channels: the name is an ordinary
    // one there, and dev mode allows it to anyone.
    subscribe(&mut c, "chat:room#1,2").await.expect("an ordinary name in `chat`");
}
