//! SIGTERM-style shutdown: stop accepting, close sockets with 1001 and a
//! disconnect frame, flush the engine, within the grace period.

use std::time::{Duration, Instant};

use herald_test_support::*;
use serde_json::json;

#[tokio::test]
async fn shutdown_closes_sockets_with_going_away_and_keeps_data() {
    let dir = tempfile::tempdir().unwrap();
    let mut srv = TestServer::start_in(dir.path().to_path_buf(), |c| {
        c.shutdown.grace = Duration::from_secs(5);
    })
    .await;
    let mut c = srv.connect("u").await;
    c.subscribe("chat:g", None).await.unwrap();
    for i in 1..=5 {
        assert_eq!(srv.publish("chat:g", json!(i)).await.status, 201);
    }
    assert_eq!(next_messages(&mut c, 5).await.len(), 5);

    let started = Instant::now();
    let stop = async { srv.stop_now().await };
    let read = read_until_closed(&mut c);
    let ((), (frames, code)) = tokio::join!(stop, read);
    assert!(started.elapsed() < Duration::from_secs(5), "done within the grace period");
    assert_eq!(code, Some(1001));
    let d = frames.iter().find(|f| f.kind == "disconnect").expect("disconnect frame");
    assert_eq!(d.reconnect, Some(true));
    // New connections are refused after shutdown.
    assert!(reqwest::get(format!("{}/healthz", srv.url)).await.is_err());

    // Everything acknowledged is there after a restart on the same data dir
    // (the engine's lock is released when the last handle goes).
    drop(c);
    drop(srv);
    let srv2 = TestServer::start_in(dir.path().to_path_buf(), |_| {}).await;
    let hist = srv2.history("chat:g").await;
    assert_eq!(hist.len(), 5);
}
