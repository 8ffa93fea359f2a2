//! `Log::append_batch` on the embedded engine: one queue hand-off, one
//! group commit, each request answered on its own, in order.

mod common;

use std::time::Duration;

use common::{channel, dedup, open, req};
use herald_core::{AppendRequest, Dedup, EngineError, Log};

#[tokio::test]
async fn a_batch_is_one_group_commit_answered_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), |_| {});
    let (a, b) = (channel("chat:a"), channel("chat:b"));
    engine
        .append(AppendRequest { dedup: Some(dedup("k", Duration::from_secs(60))), ..req(&a, "0") })
        .await
        .unwrap();
    let before = engine.stats().batches;
    let reqs = vec![
        req(&a, "1"),
        req(&b, "1"),
        // The same key with another request: refused, the others stand.
        AppendRequest {
            dedup: Some(Dedup { fingerprint: [2; 32], ..dedup("k", Duration::from_secs(60)) }),
            ..req(&a, "\"other\"")
        },
        req(&a, "2"),
        // The same key, the same request: the original receipt.
        AppendRequest { dedup: Some(dedup("k", Duration::from_secs(60))), ..req(&a, "0") },
        req(&b, "2"),
    ];
    let results = engine.append_batch(reqs).await;
    assert_eq!(engine.stats().batches - before, 1, "one group commit");
    let seqs: Vec<_> =
        results.iter().map(|r| r.as_ref().map(|r| (r.channel.as_str().to_owned(), r.seq))).collect();
    assert_eq!(seqs[0], Ok(("chat:a".into(), Some(2))));
    assert_eq!(seqs[1], Ok(("chat:b".into(), Some(1))));
    assert_eq!(seqs[2], Err(&EngineError::IdempotencyMismatch));
    assert_eq!(seqs[3], Ok(("chat:a".into(), Some(3))));
    assert_eq!(seqs[4], Ok(("chat:a".into(), Some(1))));
    assert!(results[4].as_ref().unwrap().duplicate);
    assert_eq!(seqs[5], Ok(("chat:b".into(), Some(2))));
    let page = engine.read(&a, 0, 10).await.unwrap();
    assert_eq!(page.messages.iter().map(|m| m.seq.unwrap()).collect::<Vec<_>>(), vec![1, 2, 3]);
}

#[tokio::test]
async fn a_batch_after_a_storage_failure_fails_whole() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), |_| {});
    let a = channel("chat:a");
    engine.inject_failure();
    let results = engine.append_batch(vec![req(&a, "1"), req(&a, "2"), req(&a, "3")]).await;
    assert!(results.iter().all(|r| matches!(r, Err(EngineError::Failed(_)))), "{results:?}");
    let results = engine.append_batch(vec![req(&a, "4"), req(&a, "5")]).await;
    assert!(results.iter().all(|r| matches!(r, Err(EngineError::Failed(_)))), "{results:?}");
}
