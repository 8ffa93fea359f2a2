//! The engine conformance suite (herald-core) against the Redis engine on a
//! single instance, one test per scenario, each on its own `redis-server`
//! (and its own key prefix, as on the shared cluster).

use std::sync::Arc;

use herald_core::conformance::{self, Fixture};
use herald_core::Engine;
use herald_redis::testing::{self, RedisServer};

macro_rules! conformance_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                testing::init_tracing();
                let redis = RedisServer::start();
                let engine: Arc<dyn Engine> = testing::fixture_engine(&redis.url()).await;
                let fx = Fixture::new(engine);
                conformance::$name(&fx).await;
                fx.engine.close().await;
            }
        )*
    };
}

herald_core::with_conformance_scenarios!(conformance_tests);
