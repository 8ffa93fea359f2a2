//! The personal channel on `/ws` (`[personal] subscribe`): a `subscribed`
//! frame first, then the channel delivers as a subscription the client
//! made; the Rust client hands it over as a `Subscription` when asked
//! (`server_subscriptions`) and declines it otherwise. The Centrifugo side
//! is in `centrifugo_protocol.rs`.

use herald_client::{Client, ClientOptions, ConnectOptions, Event};
use herald_test_support::*;
use serde_json::json;

async fn server() -> TestServer {
    TestServer::start_with(|c| c.personal.subscribe = true).await
}

fn client(srv: &TestServer, user: &str, take: bool) -> Client {
    let mut opts = ClientOptions::new(ConnectOptions::dev_user(&srv.url, user));
    opts.server_subscriptions = take;
    Client::new(opts)
}

/// `herald_subscriptions` from `/metrics`.
async fn subscriptions(srv: &TestServer) -> i64 {
    let text = srv.get("/metrics").await.body;
    text.as_str()
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("herald_subscriptions "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the gauge")
}

#[tokio::test]
async fn the_rust_client_takes_the_personal_channel_with_its_inbox() {
    let srv = server().await;
    // Waiting in the inbox before the client connects (acked `user`).
    srv.publish("user:p1", json!("early")).await;
    let c = client(&srv, "p1", true);
    let mut sub =
        tokio::time::timeout(WAIT, c.next_server_subscription()).await.unwrap().expect("handed over");
    assert_eq!(sub.channel().as_str(), "user:p1");
    let first = tokio::time::timeout(WAIT, sub.next()).await.unwrap().unwrap().unwrap();
    let Event::Message(m) = first else { panic!("{first:?}") };
    assert_eq!((m.seq, m.data.get()), (Some(1), "\"early\""));
    srv.publish("user:p1", json!("live")).await;
    let Event::Message(m) = tokio::time::timeout(WAIT, sub.next()).await.unwrap().unwrap().unwrap() else {
        panic!()
    };
    assert_eq!(m.seq, Some(2));
}

#[tokio::test]
async fn a_client_that_does_not_take_it_declines_it() {
    let srv = server().await;
    let c = client(&srv, "p2", false);
    let _other = c.subscribe("chat:p2", None).await.unwrap();
    // The personal channel is unsubscribed again: one subscription left.
    assert_eventually("declined", || async { subscriptions(&srv).await == 1 }).await;
    assert!(c.next_server_subscription().await.is_none());
}
