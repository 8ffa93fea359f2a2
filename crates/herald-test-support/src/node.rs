//! Herald nodes on Redis: a [`Node`] is a [`TestServer`] over a
//! `RedisEngine`, so several of them on one Redis make a cluster of Herald
//! nodes in one test process. A [`CrashableNode`] can die the way a
//! process does.

use std::sync::Arc;
use std::time::Duration;

use herald_redis::testing::engine_config;
use herald_redis::{RedisConfig, RedisEngine};
use herald_server::Config;

use crate::server::{base_config, TestServer};

/// A Herald node: a server on `127.0.0.1:0` with its own `RedisEngine`.
pub type Node = TestServer<RedisEngine>;

impl TestServer<RedisEngine> {
    /// A node on the Redis at `redis_url` (a comma-separated seed list for
    /// a cluster), with the test engine settings
    /// ([`engine_config`]).
    pub async fn on_redis(redis_url: &str) -> Self {
        Self::on_redis_with(engine_config(redis_url), |_| {}).await
    }

    /// A node with these engine settings and [`base_config`] changed by
    /// `tweak`.
    pub async fn on_redis_with(engine_config: RedisConfig, tweak: impl FnOnce(&mut Config)) -> Self {
        let mut config = base_config();
        tweak(&mut config);
        let engine = Arc::new(RedisEngine::open(engine_config).await.expect("open redis engine"));
        Self::serve(config, engine).await
    }
}

/// Server settings for presence tests: leases of `ttl` (renewed every
/// third of it), swept every 100 ms.
pub fn presence_config(ttl: Duration) -> impl FnOnce(&mut Config) + Send + 'static {
    move |c: &mut Config| {
        c.presence.member_lease_ttl = ttl;
        c.presence.sweep_interval = Duration::from_millis(100);
    }
}

/// A Herald node in a runtime of its own, so it can die the way a process
/// does: [`crash`](CrashableNode::crash) drops every task of it at once
/// (sessions, keeper, the engine's connections and lease), and no cleanup
/// reaches Redis. Its clients see their sockets close.
pub struct CrashableNode {
    node: Option<Node>,
    rt: Option<tokio::runtime::Runtime>,
}

impl CrashableNode {
    pub async fn on_redis_with(
        engine_config: RedisConfig,
        tweak: impl FnOnce(&mut Config) + Send + 'static,
    ) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("node runtime");
        let node = rt.spawn(Node::on_redis_with(engine_config, tweak)).await.expect("node starts");
        CrashableNode { node: Some(node), rt: Some(rt) }
    }

    pub fn node(&self) -> &Node {
        self.node.as_ref().expect("not crashed")
    }

    /// Stop the node's runtime without running anything more on it.
    pub fn crash(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
        self.node = None;
    }
}

impl Drop for CrashableNode {
    fn drop(&mut self) {
        // A runtime cannot be dropped (it blocks) inside the test's runtime.
        self.crash();
    }
}
