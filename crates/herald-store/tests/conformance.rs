//! The engine conformance suite (herald-core) against the embedded engine,
//! one test per scenario, each on a fresh data dir.

use std::sync::Arc;

use herald_core::conformance::{self, Fixture};
use herald_core::Engine;
use herald_store::{EmbeddedEngine, StoreConfig};

/// A fresh engine in its own temp dir (removed when the guard drops, after
/// the engine).
struct Fresh {
    fx: Fixture,
    _dir: tempfile::TempDir,
}

fn fresh() -> Fresh {
    let dir = tempfile::tempdir().expect("temp dir");
    let engine = EmbeddedEngine::open(StoreConfig::new(dir.path())).expect("open engine");
    let engine: Arc<dyn Engine> = Arc::new(engine);
    Fresh { fx: Fixture::new(engine), _dir: dir }
}

macro_rules! conformance_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let f = fresh();
                conformance::$name(&f.fx).await;
                f.fx.engine.close().await;
            }
        )*
    };
}

herald_core::with_conformance_scenarios!(conformance_tests);

/// `run_all` itself, with a factory that keeps every data dir alive until
/// the end of the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_all_passes() {
    let base = tempfile::tempdir().expect("temp dir");
    let next = std::sync::atomic::AtomicUsize::new(0);
    conformance::run_all(|| {
        let path = base.path().join(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed).to_string());
        async move {
            let engine = EmbeddedEngine::open(StoreConfig::new(path)).expect("open engine");
            Arc::new(engine) as Arc<dyn Engine>
        }
    })
    .await;
}
