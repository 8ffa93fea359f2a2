//! Tools for testing against Redis, behind the `test-util` feature (a
//! dev-dependency's feature, never a release build's): private
//! `redis-server` processes (a single instance or a cluster) on free ports
//! in temp dirs, killed on drop; a TCP proxy that can cut a client off
//! from Redis; and engines configured for tests. Never touches a shared
//! Redis.
//!
//! This crate's own tests use it, and so does `herald-test-support` (Herald
//! nodes on Redis), so both start Redis one way.

mod proxy;
mod server;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use proxy::RedisProxy;
pub use server::{cli, signal, RedisCluster, RedisServer};

use crate::{RedisConfig, RedisEngine};

/// Logs to the test's output, filtered by `HERALD_TEST_LOG` (default
/// `warn`). Call it first in a test; later calls do nothing.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HERALD_TEST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Engine settings for tests: short checks so lost messages show quickly.
pub fn engine_config(url: &str) -> RedisConfig {
    let mut c = RedisConfig::new(url);
    c.head_check_interval = Duration::from_millis(200);
    c.command_timeout = Duration::from_secs(2);
    c.lease_ttl = Duration::from_secs(2);
    c
}

/// An engine on `url` with [`engine_config`].
pub async fn engine(url: &str) -> Arc<RedisEngine> {
    Arc::new(RedisEngine::open(engine_config(url)).await.expect("open redis engine"))
}

/// An engine under a key prefix of its own (`herald-f<pid>-<n>`), for a
/// conformance fixture: `presence_expire` sweeps every channel of the
/// prefix, so the expiry scenarios need an index no other fixture on the
/// same Redis sweeps.
pub async fn fixture_engine(url: &str) -> Arc<RedisEngine> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut config = engine_config(url);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    config.key_prefix = format!("herald-f{}-{n}", std::process::id());
    Arc::new(RedisEngine::open(config).await.expect("open redis engine"))
}
