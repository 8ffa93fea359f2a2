//! The engine conformance suite against the Redis engine on a 3-master
//! Redis Cluster: every scenario (`run_all` walks `scenarios()`), each on a
//! fresh engine, all on one cluster (scenarios use unique channel names,
//! and each engine its own key prefix, so its presence sweep index is its
//! own).

use std::sync::Arc;

use herald_core::conformance;
use herald_core::Engine;
use herald_redis::testing::{self, RedisCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_passes_on_a_cluster() {
    testing::init_tracing();
    let cluster = RedisCluster::start();
    let url = cluster.url();
    conformance::run_all(|| {
        let url = url.clone();
        async move { testing::fixture_engine(&url).await as Arc<dyn Engine> }
    })
    .await;
}
