//! What survives closing, dropping and reopening a data dir.

mod common;

use std::time::Duration;

use common::{channel, dedup, open, req};
use herald_core::{AppendRequest, Lifecycle, Log, Retention};
use herald_store::StoreError;

#[tokio::test]
async fn reopen_recovers_every_message_head_and_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (channel("chat:a"), channel("chat:b"));
    let engine = open(dir.path(), |_| {});
    let epoch = engine.epoch();
    let mut frames = Vec::new();
    for i in 1..=50 {
        engine.append(req(&a, &i.to_string())).await.unwrap();
    }
    for i in 1..=7 {
        let trimmed =
            AppendRequest { retention: Retention { max_len: 3, max_age: None }, ..req(&b, &i.to_string()) };
        engine.append(trimmed).await.unwrap();
    }
    for m in engine.read(&a, 0, 100).await.unwrap().messages {
        frames.push(m.frame.clone());
    }
    engine.close().await;
    drop(engine);

    let engine = open(dir.path(), |_| {});
    assert_eq!(engine.epoch(), epoch, "same data dir, same epoch");
    let pa = engine.position(&a).await.unwrap();
    assert_eq!((pa.head, pa.first, &pa.epoch), (50, 1, &epoch));
    let page = engine.read(&a, 0, 100).await.unwrap();
    let reread: Vec<_> = page.messages.iter().map(|m| m.frame.clone()).collect();
    assert_eq!(reread, frames, "the stored frames, byte for byte");
    let pb = engine.position(&b).await.unwrap();
    assert_eq!((pb.head, pb.first), (7, 5), "trimming survives a restart");
    assert_eq!(engine.append(req(&a, "51")).await.unwrap().seq, Some(51), "seqs continue");
    engine.close().await;
}

#[tokio::test]
async fn a_new_data_dir_gets_a_new_epoch() {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let e1 = open(d1.path(), |_| {});
    let e2 = open(d2.path(), |_| {});
    assert_ne!(e1.epoch(), e2.epoch());
    let ch = channel("user:1");
    assert_eq!(e1.position(&ch).await.unwrap().epoch, e1.epoch());
}

#[tokio::test]
async fn receipts_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ch = channel("orders:1");
    let keyed = || AppendRequest { dedup: Some(dedup("k", Duration::from_secs(3600))), ..req(&ch, "1") };
    let engine = open(dir.path(), |_| {});
    let original = engine.append(keyed()).await.unwrap();
    drop(engine); // without close: drop still persists and releases the dir

    let engine = open(dir.path(), |_| {});
    let retry = engine.append(keyed()).await.unwrap();
    assert!(retry.duplicate);
    assert_eq!((retry.seq, retry.id, retry.ts), (original.seq, original.id, original.ts));
    assert_eq!(engine.position(&ch).await.unwrap().head, 1);
}

#[tokio::test]
async fn a_data_dir_opens_once_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), |_| {});
    let second = herald_store::EmbeddedEngine::open(herald_store::StoreConfig::new(dir.path()));
    assert!(matches!(second, Err(StoreError::Locked { .. })), "{:?}", second.err());
    drop(engine);
    let _again = open(dir.path(), |_| {});
}

#[tokio::test]
async fn close_finishes_queued_appends_then_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let engine = std::sync::Arc::new(open(dir.path(), |c| c.max_batch = 8));
    let ch = channel("chat:close");
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let (engine, ch) = (engine.clone(), ch.clone());
            tokio::spawn(async move { engine.append(req(&ch, &i.to_string())).await })
        })
        .collect();
    tokio::task::yield_now().await;
    engine.close().await;
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) => assert_eq!(e, herald_core::EngineError::ShuttingDown),
        }
    }
    let pos = engine.position(&ch).await.unwrap();
    assert_eq!(pos.head, ok, "every Ok append is in the log, nothing else");
    assert_eq!(engine.health(), herald_core::Health::Unavailable("embedded store is closed".into()));
}

/// Every journal (`*.jnl`) under `dir`, with the bytes allocated to it.
fn journals(dir: &std::path::Path) -> Vec<(std::path::PathBuf, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(d).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|x| x == "jnl") {
                let allocated = std::fs::metadata(&path).unwrap().blocks() * 512;
                found.push((path, allocated));
            }
        }
    }
    found
}

/// The journal is preallocated as a hole; zeros are written ahead of its
/// data, so an fsync writes data blocks and not the file's block map each
/// time. (Every journal the other tests write has zeros ahead:
/// `reopen_recovers_every_message_head_and_epoch` reads them back byte for
/// byte and appends after them, crash.rs recovers over them after `kill -9`.)
#[tokio::test]
async fn the_journal_is_zeroed_ahead_of_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let ch = channel("chat:z");
    let engine = open(dir.path(), |_| {});
    for i in 1..=20 {
        engine.append(req(&ch, &i.to_string())).await.unwrap();
    }
    // 20 small appends are a few KiB of journal; at least the first 64 KiB
    // chunk of zeros is allocated ahead of them (a hole: only the data's
    // blocks).
    let found = journals(dir.path());
    assert!(!found.is_empty(), "a journal under the data dir");
    let most = found.iter().map(|(_, a)| *a).max().unwrap();
    assert!(most >= 64 * 1024, "the active journal has zeros allocated ahead: {found:?}");
    engine.close().await;
}
