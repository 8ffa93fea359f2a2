//! Retention by age and receipt expiry, run by the engine's sweeper.

mod common;

use std::time::Duration;

use common::{channel, dedup, open, req};
use herald_core::conformance::assert_eventually;
use herald_core::{AppendRequest, Lifecycle, Log, Retention};
use herald_store::FsyncMode;

fn aged(ch: &herald_proto::ChannelName, data: &str, max_age: Duration) -> AppendRequest {
    AppendRequest { retention: Retention { max_len: 0, max_age: Some(max_age) }, ..req(ch, data) }
}

#[tokio::test]
async fn sweeper_removes_messages_older_than_max_age() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), |c| c.sweep_interval = Duration::from_millis(20));
    let (short, long) = (channel("live:short"), channel("live:long"));
    for i in 1..=3 {
        engine.append(aged(&short, &i.to_string(), Duration::from_millis(100))).await.unwrap();
        engine.append(aged(&long, &i.to_string(), Duration::from_secs(3600))).await.unwrap();
    }
    assert_eventually("short channel expired", || async {
        engine.position(&short).await.unwrap().first == 4
    })
    .await;
    let pos = engine.position(&short).await.unwrap();
    assert_eq!((pos.head, pos.first), (3, 4), "an emptied log keeps its head");
    assert!(engine.read(&short, 0, 10).await.unwrap().messages.is_empty());
    assert_eq!(engine.read(&long, 0, 10).await.unwrap().messages.len(), 3, "young messages stay");

    let r = engine.append(aged(&short, "4", Duration::from_secs(3600))).await.unwrap();
    assert_eq!(r.seq, Some(4), "seqs continue after expiry");
    let page = engine.read(&short, 1, 10).await.unwrap();
    assert_eq!(page.messages.iter().map(|m| m.seq).collect::<Vec<_>>(), vec![Some(4)]);
    assert!(engine.stats().expired >= 3);
    engine.close().await;
}

/// More expired entries than one sweep slice may delete: the sweep goes on
/// in slices until done, and the log stays gap-free throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_backlog_expires_in_bounded_slices() {
    const N: u64 = 6000; // > one slice's delete budget
    let dir = tempfile::tempdir().unwrap();
    let engine = std::sync::Arc::new(open(dir.path(), |c| {
        c.sweep_interval = Duration::from_millis(50);
        c.fsync = FsyncMode::Never;
    }));
    let ch = channel("feed:big");
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (engine, ch) = (engine.clone(), ch.clone());
            tokio::spawn(async move {
                for _ in 0..N / 8 {
                    engine.append(aged(&ch, "0", Duration::from_millis(300))).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eventually("the whole backlog expired", || async {
        // One snapshot: the sweeper runs concurrently, so a separate
        // `position` call may already be older than the read.
        let page = engine.read(&ch, 0, 10).await.unwrap();
        // Whatever is left is gap-free from `first`.
        if let Some(m) = page.messages.first() {
            assert_eq!(m.seq, Some(page.position.first));
        }
        page.position.first == N + 1
    })
    .await;
    assert_eq!(engine.stats().expired, N);
    engine.close().await;
}

#[tokio::test]
async fn expired_receipts_no_longer_dedup_and_are_swept() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), |c| c.sweep_interval = Duration::from_millis(20));
    let ch = channel("orders:9");
    let keyed =
        || AppendRequest { dedup: Some(dedup("order-9", Duration::from_millis(150))), ..req(&ch, "1") };
    let first = engine.append(keyed()).await.unwrap();
    let retry = engine.append(keyed()).await.unwrap();
    assert!(retry.duplicate && retry.seq == first.seq, "within the TTL: a duplicate");
    assert_eventually("receipt swept", || async { engine.stats().receipts_expired == 1 }).await;
    let after = engine.append(keyed()).await.unwrap();
    assert!(!after.duplicate, "after the TTL the key is free again");
    assert_eq!(after.seq, Some(2));
    engine.close().await;
}

/// An expired receipt counts as absent even before the sweeper removed it.
#[tokio::test]
async fn an_expired_receipt_is_absent_before_the_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), |c| c.sweep_interval = Duration::from_secs(3600));
    let ch = channel("orders:10");
    let keyed =
        || AppendRequest { dedup: Some(dedup("order-10", Duration::from_millis(50))), ..req(&ch, "1") };
    engine.append(keyed()).await.unwrap();
    assert_eventually("a retry appends again", || async { !engine.append(keyed()).await.unwrap().duplicate })
        .await;
    assert_eq!(engine.position(&ch).await.unwrap().head, 2, "exactly one more append");
    assert_eq!(engine.stats().receipts_expired, 0);
    engine.close().await;
}
