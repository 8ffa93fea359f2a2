//! A storage failure stops the engine for writes: nothing is acknowledged
//! after it, and health reports it.

mod common;

use std::sync::Arc;

use common::{channel, open, req};
use herald_core::{AppendRequest, EngineError, Health, Lifecycle, Log};

fn is_failed<T: std::fmt::Debug>(r: &Result<T, EngineError>) -> bool {
    matches!(r, Err(EngineError::Failed(_)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_storage_failure_nothing_is_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(open(dir.path(), |_| {}));
    let ch = channel("chat:f");
    for i in 1..=3 {
        engine.append(req(&ch, &i.to_string())).await.unwrap();
    }
    assert_eq!(engine.health(), Health::Ready);

    engine.inject_failure();
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let (engine, ch) = (engine.clone(), ch.clone());
            tokio::spawn(async move { engine.append(req(&ch, &i.to_string())).await })
        })
        .collect();
    for t in tasks {
        let r = t.await.unwrap();
        assert!(is_failed(&r), "{r:?}");
    }
    assert!(is_failed(&engine.append(req(&ch, "\"later\"")).await));
    let volatile = AppendRequest { durable: false, ..req(&ch, "\"typing\"") };
    assert!(is_failed(&engine.append(volatile).await), "volatile appends are refused too");
    assert!(matches!(engine.health(), Health::Failed(_)), "{:?}", engine.health());
    assert!(engine.stats().failed >= 22);

    // Reads still serve what was durable before the failure.
    let page = engine.read(&ch, 0, 100).await.unwrap();
    assert_eq!(page.position.head, 3);
    engine.close().await;
    drop(engine);

    // A restart clears fail-stop; the log is as it was.
    let engine = open(dir.path(), |_| {});
    assert_eq!(engine.health(), Health::Ready);
    assert_eq!(engine.position(&ch).await.unwrap().head, 3);
    assert_eq!(engine.append(req(&ch, "4")).await.unwrap().seq, Some(4));
}

#[tokio::test]
async fn stats_count_appends_batches_and_fsyncs() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), |_| {});
    let ch = channel("chat:s");
    for i in 0..5 {
        engine.append(req(&ch, &i.to_string())).await.unwrap();
    }
    let s = engine.stats();
    assert_eq!((s.appends, s.batch_requests, s.failed, s.queue_depth), (5, 5, 0, 0));
    assert!(s.batches >= 1 && s.batches <= 5);
    assert!(s.fsyncs >= 1 && s.fsyncs <= s.batches);
}
