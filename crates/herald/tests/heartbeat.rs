//! Server pings, idle timeout and token expiry while connected.

use std::time::Duration;

use herald_client::{ConnectOptions, Connection, ServerEvent};
use herald_test_support::*;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::json;

fn fast_heartbeat(c: &mut herald_server::Config) {
    c.heartbeat.ping_interval = Duration::from_millis(100);
    c.heartbeat.idle_timeout = Duration::from_millis(400);
}

#[tokio::test]
async fn a_client_that_answers_pings_stays_connected() {
    let srv = TestServer::start_with(fast_heartbeat).await;
    let mut c = srv.connect("alive").await;
    // Reading keeps answering the server's pings (tokio-websockets does it),
    // so well past the idle timeout we are still connected.
    assert_silent(&mut c, Duration::from_millis(1200)).await;
    assert_eq!(c.ping().await.unwrap().kind, "pong");
}

#[tokio::test]
async fn a_silent_client_is_closed_after_the_idle_timeout() {
    let srv = TestServer::start_with(fast_heartbeat).await;
    let mut c = srv.connect("silent").await;
    // Not reading means not answering pings: the server sees nothing.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (frames, code) = read_until_closed(&mut c).await;
    assert_eq!(code, Some(4004));
    assert!(frames.iter().any(|f| f.kind == "disconnect" && f.reconnect == Some(true)));
}

#[tokio::test]
async fn an_expiring_token_closes_the_connection_with_4003() {
    let srv = TestServer::start_with(|c| {
        fast_heartbeat(c);
        c.heartbeat.idle_timeout = Duration::from_secs(30);
        c.dev = false;
    })
    .await;
    let exp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 2;
    let token = encode(
        &Header::new(Algorithm::HS256),
        &json!({ "sub": "short", "exp": exp, "channels": ["chat:*"] }),
        &EncodingKey::from_secret(JWT_SECRET.as_bytes()),
    )
    .unwrap();
    let mut c = Connection::connect(&ConnectOptions::token(&srv.url, token)).await.unwrap();
    assert_eq!(c.subscribe("chat:exp", None).await.unwrap().kind, "ok");
    let closed = tokio::time::timeout(Duration::from_secs(6), async {
        loop {
            match c.next_frame().await {
                Ok(Some(ServerEvent::Closed { code, .. })) => return code,
                Ok(Some(ServerEvent::Frame(_))) => continue,
                other => panic!("unexpected {other:?}"),
            }
        }
    })
    .await
    .expect("closed soon after exp");
    assert_eq!(closed, Some(4003));
}
