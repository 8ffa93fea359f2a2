//! Draining a node (SIGTERM, or `POST /api/v1/admin/drain`): `/readyz`
//! answers 503 at once and new WebSocket upgrades are refused while the
//! open sessions are closed one by one over `shutdown.drain_period` with
//! 4010 (reconnect elsewhere now); HTTP keeps serving; a second SIGTERM
//! closes the rest at once. The spreading itself is checked with paused
//! time in `hub::sessions`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use herald_test_support::*;
use serde_json::json;
use tokio_websockets::{ClientBuilder, MaybeTlsStream, WebSocketStream};

type Socket = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

async fn dial(base: &str, user: &str) -> Result<Socket, tokio_websockets::Error> {
    let url = format!("{}/ws?user={user}", base.replace("http://", "ws://"));
    Ok(ClientBuilder::new().uri(&url).unwrap().connect().await?.0)
}

/// Read until the close; its code and when it came.
async fn closed(mut ws: Socket) -> (Option<u16>, Instant) {
    loop {
        match tokio::time::timeout(WAIT * 2, ws.next()).await.expect("closed in time") {
            Some(Ok(m)) if m.is_close() => return (m.as_close().map(|(c, _)| c.into()), Instant::now()),
            Some(Ok(_)) => {}
            _ => return (None, Instant::now()),
        }
    }
}

async fn status(url: &str) -> u16 {
    reqwest::get(url).await.map(|r| r.status().as_u16()).unwrap_or(0)
}

#[tokio::test]
async fn the_api_drains_a_node_spread_over_the_period_while_http_serves() {
    let srv = TestServer::start_with(|c| c.shutdown.drain_period = Duration::from_secs(3)).await;
    let mut socks = Vec::new();
    for i in 0..6 {
        socks.push(dial(&srv.url, &format!("d{i}")).await.expect("upgrade"));
    }
    assert_eq!(status(&format!("{}/readyz", srv.url)).await, 200);
    let started = Instant::now();
    let r = srv.call("POST", "/api/v1/admin/drain", None, &[]).await;
    assert_eq!((r.status, r.body["started"].clone()), (202, json!(true)), "{}", r.body);
    let again = srv.call("POST", "/api/v1/admin/drain", None, &[]).await;
    assert_eq!((again.status, again.body["started"].clone()), (202, json!(false)), "idempotent");

    assert_eq!(status(&format!("{}/readyz", srv.url)).await, 503, "not ready at once");
    let refused = dial(&srv.url, "late").await;
    assert!(refused.is_err(), "a new WebSocket is refused while draining");
    // HTTP keeps serving.
    assert_eq!(srv.publish("chat:drain", json!(1)).await.status, 201);

    let closes = futures_util::future::join_all(socks.into_iter().map(closed)).await;
    assert!(closes.iter().all(|(code, _)| *code == Some(4010)), "{closes:?}");
    let first = closes.iter().map(|(_, t)| *t).min().unwrap();
    let last = closes.iter().map(|(_, t)| *t).max().unwrap();
    assert!(first - started < Duration::from_secs(2), "the first goes at once");
    // Six sessions over 3 s: one every half second, the last at 2.5 s.
    assert!(last - first >= Duration::from_millis(2000), "spread, not a burst: {:?}", last - first);
    let metrics = srv.get("/metrics").await.body;
    assert!(metrics.as_str().unwrap().contains(r#"herald_closes_total{reason="drain"} 6"#), "{metrics}");
}

fn spawn(drain_period: &str) -> HeraldProcess {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
    cmd.args(["serve", "--dev", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .env("HERALD_API_KEYS", API_KEY)
        .env("HERALD_LOG", "warn")
        .env("HERALD_DRAIN_PERIOD", drain_period)
        .stderr(Stdio::inherit());
    HeraldProcess::spawn(&mut cmd, Some(dir))
}

#[tokio::test]
async fn sigterm_drains_and_a_second_sigterm_closes_the_rest_at_once() {
    let mut herald = spawn("20s");
    let mut socks = Vec::new();
    for i in 0..4 {
        socks.push(dial(&herald.url, &format!("s{i}")).await.expect("upgrade"));
    }
    let sent = Instant::now();
    signal(herald.pid, "TERM");
    assert_eventually("not ready", || async { status(&format!("{}/readyz", herald.url)).await == 503 }).await;
    let mut socks = socks.into_iter();
    let (code, at) = closed(socks.next().unwrap()).await;
    assert_eq!(code, Some(4010));
    assert!(at - sent < Duration::from_secs(3), "the first at once");
    // Four sessions over 20 s: the next would go at 5 s. A second SIGTERM
    // closes them now.
    signal(herald.pid, "TERM");
    for ws in socks {
        let (code, at) = closed(ws).await;
        assert!(matches!(code, Some(4010) | Some(1001)), "{code:?}");
        assert!(at - sent < Duration::from_secs(4), "hurried, not at its turn: {:?}", at - sent);
    }
    let exit = tokio::task::spawn_blocking(move || herald.wait_exit()).await.unwrap();
    assert!(exit.success(), "a clean shutdown: {exit:?}");
}

#[tokio::test]
async fn without_a_drain_period_sigterm_closes_everything_at_once() {
    let mut herald = spawn("0s");
    let ws = dial(&herald.url, "z").await.expect("upgrade");
    signal(herald.pid, "TERM");
    assert_eq!(closed(ws).await.0, Some(1001));
    let exit = tokio::task::spawn_blocking(move || herald.wait_exit()).await.unwrap();
    assert!(exit.success());
}
