//! The engine's sockets to Redis: each has TCP keepalive, so a Redis that
//! vanished is noticed even on an idle connection.

use herald_core::conformance::eventually;
use herald_redis::testing::{self, RedisServer};

/// Every socket the engine opens to Redis (each command connection, the
/// fan-out's pub/sub connection and the control channel's) has TCP
/// keepalive on, so a peer that vanished is
/// noticed even on an idle connection (`TCP_USER_TIMEOUT` is set with it;
/// `ss` does not show that one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_redis_socket_has_keepalive() {
    testing::init_tracing();
    if std::process::Command::new("ss").arg("-V").output().is_err() {
        eprintln!("SKIPPED: `ss` (iproute2) is not installed");
        return;
    }
    let redis = RedisServer::start();
    let config = testing::engine_config(&redis.url());
    let expected = config.connections + 2;
    let engine = herald_redis::RedisEngine::open(config).await.unwrap();
    let sockets = || {
        let out = std::process::Command::new("ss")
            .args(["-tno", "state", "established", "dst", &format!("127.0.0.1:{}", redis.port)])
            .output()
            .expect("run ss");
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        out.lines().skip(1).map(str::to_owned).collect::<Vec<_>>()
    };
    // A socket with a request in flight shows its retransmission timer
    // instead: sampled until every one is idle.
    eventually("every engine socket idle with a keepalive timer", || async {
        let l = sockets();
        (l.len() == expected && l.iter().all(|l| l.contains("timer:(keepalive"))).then_some(())
    })
    .await;
    use herald_core::Lifecycle;
    engine.close().await;
}
