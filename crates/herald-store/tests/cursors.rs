//! Cursors in the embedded engine: what survives a restart, what an ack
//! costs in fsyncs, and how retention counts the unacked messages it
//! removes. (The engine-neutral semantics are in the conformance suite.)

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{channel, open, req};
use herald_core::conformance::assert_eventually;
use herald_core::{
    AckError, AppendRequest, Cursors, Engine, EngineError, Lifecycle, Log, Retention, SubscriberId,
};
use herald_proto::ChannelName;

fn sub(user: &str, device: Option<&str>) -> SubscriberId {
    SubscriberId::new(user, device.map(Arc::from)).unwrap()
}

async fn fill(engine: &impl Engine, ch: &ChannelName, n: u64) {
    for i in 0..n {
        engine.append(req(ch, &i.to_string())).await.unwrap();
    }
}

fn capped(ch: &ChannelName, max_len: u64) -> AppendRequest {
    AppendRequest { retention: Retention { max_len, max_age: None }, ..req(ch, "0") }
}

#[tokio::test]
async fn cursors_survive_close_and_drop() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (channel("user:ann"), channel("chat:x"));
    let (phone, laptop, bare) = (sub("ann", Some("phone")), sub("ann", Some("laptop")), sub("ann", None));
    let engine = open(dir.path(), |_| {});
    fill(&engine, &a, 10).await;
    fill(&engine, &b, 10).await;
    let s1 = engine.ack(&a, &phone, 7).await.unwrap();
    let s2 = engine.ack(&a, &laptop, 3).await.unwrap();
    let s3 = engine.ack(&b, &bare, 10).await.unwrap();
    let receipts = engine.cursors(&a, 100).await.unwrap();
    let inbox = engine.user_cursors("ann", 100).await.unwrap();
    engine.close().await;
    drop(engine);

    let engine = open(dir.path(), |_| {});
    assert_eq!(engine.cursor(&a, &phone).await.unwrap(), Some(s1), "seq and ack time survive close");
    assert_eq!(engine.cursor(&a, &laptop).await.unwrap(), Some(s2));
    assert_eq!(engine.cursor(&b, &bare).await.unwrap(), Some(s3));
    assert_eq!(engine.cursors(&a, 100).await.unwrap(), receipts);
    assert_eq!(engine.user_cursors("ann", 100).await.unwrap(), inbox);
    assert_eq!(inbox.len(), 3);
    let s4 = engine.ack(&a, &laptop, 9).await.unwrap();
    drop(engine); // without close: drop still persists

    let engine = open(dir.path(), |_| {});
    assert_eq!(engine.cursor(&a, &laptop).await.unwrap(), Some(s4), "an ack survives a drop");
    assert_eq!(engine.ack(&a, &phone, 2).await.unwrap(), s1, "still monotonic after reopening");
    engine.close().await;
}

/// Acks only: no fsync per batch; the ack-sync timer fsyncs once, later,
/// and nothing more while idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_cost_no_fsync_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let ch = channel("user:f");
    let engine = open(dir.path(), |c| c.ack_sync_interval = Duration::from_secs(3600));
    fill(&engine, &ch, 100).await;
    let base = engine.stats().fsyncs;
    for seq in 1..=100 {
        engine.ack(&ch, &sub("f", None), seq).await.unwrap();
    }
    let s = engine.stats();
    assert_eq!((s.acks, s.fsyncs), (100, base), "100 acks, in 100 batches, no fsync");
    engine.close().await;
    drop(engine);

    let engine = open(dir.path(), |c| c.ack_sync_interval = Duration::from_millis(100));
    let base = engine.stats().fsyncs;
    for seq in 1..=20 {
        engine.ack(&ch, &sub("g", None), seq).await.unwrap();
    }
    assert!(engine.stats().fsyncs <= base + 1, "at most the timer's fsync so far");
    assert_eventually("the ack-sync timer fsyncs", || async { engine.stats().fsyncs == base + 1 }).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(engine.stats().fsyncs, base + 1, "no fsync while nothing waits for one");
    engine.close().await;
}

/// An append batch fsyncs anyway, and that fsync covers acks waiting for
/// theirs: the timer then has nothing left to do.
#[tokio::test]
async fn an_append_fsync_settles_waiting_acks() {
    let dir = tempfile::tempdir().unwrap();
    let ch = channel("user:h");
    let engine = open(dir.path(), |c| c.ack_sync_interval = Duration::from_secs(1));
    fill(&engine, &ch, 3).await;
    let base = engine.stats().fsyncs;
    engine.ack(&ch, &sub("h", None), 2).await.unwrap();
    engine.append(req(&ch, "4")).await.unwrap();
    assert_eq!(engine.stats().fsyncs, base + 1, "the append's fsync");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(engine.stats().fsyncs, base + 1, "no timer fsync after the append's");
    engine.close().await;
}

/// Acks racing appends on the same channels, each acking what it just
/// appended: acks and appends share group commits, every ack is within the
/// head it saw, and the cursors end at the head.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acks_and_appends_share_batches() {
    const PER_TASK: u64 = 50;
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(open(dir.path(), |_| {}));
    let channels: Vec<_> = (0..4).map(|i| channel(&format!("user:{i}"))).collect();
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let (engine, ch) = (engine.clone(), channels[t % 4].clone());
            let me = sub(&format!("{}", t % 4), Some(&format!("d{t}")));
            tokio::spawn(async move {
                for _ in 0..PER_TASK {
                    let seq = engine.append(req(&ch, "1")).await.unwrap().seq.unwrap();
                    let state = engine.ack(&ch, &me, seq).await.unwrap();
                    assert!(state.seq >= seq);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    for ch in &channels {
        let head = engine.position(ch).await.unwrap().head;
        assert_eq!(head, 4 * PER_TASK);
        for (s, state) in engine.cursors(ch, 100).await.unwrap() {
            assert!(state.seq <= head, "{s:?}");
        }
    }
    let s = engine.stats();
    assert_eq!(s.acks + s.acks_unchanged, 16 * PER_TASK);
    assert_eq!(s.acks, 16 * PER_TASK, "every ack advanced its own cursor");
    engine.close().await;
}

/// `max_len` trimming counts the removed messages that some cursor had not
/// reached, once per message, and nothing on channels without cursors.
#[tokio::test]
async fn unacked_messages_lost_to_max_len_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), |_| {});
    let (inbox, plain) = (channel("user:t"), channel("feed:t"));
    let (slow, fast) = (sub("t", Some("slow")), sub("t", Some("fast")));
    for _ in 0..5 {
        engine.append(capped(&inbox, 5)).await.unwrap();
        engine.append(capped(&plain, 5)).await.unwrap();
    }
    engine.ack(&inbox, &slow, 2).await.unwrap();
    engine.ack(&inbox, &fast, 5).await.unwrap();
    for _ in 0..5 {
        // Trims 1..=5 of each channel, one per append.
        engine.append(capped(&inbox, 5)).await.unwrap();
        engine.append(capped(&plain, 5)).await.unwrap();
    }
    let s = engine.stats();
    assert_eq!(s.trimmed, 10);
    assert_eq!(s.unacked_trimmed, 3, "3, 4 and 5 were unacked by `slow`; `fast` adds nothing");

    // `slow` catches up past `fast`: the lowest cursor moved, and the
    // floor is re-read when a trim reaches above it.
    engine.ack(&inbox, &slow, 10).await.unwrap();
    for _ in 0..2 {
        engine.append(capped(&inbox, 5)).await.unwrap(); // trims 6, 7
    }
    assert_eq!(engine.stats().unacked_trimmed, 5, "6 and 7 were unacked by `fast` (at 5)");
    engine.ack(&inbox, &fast, 12).await.unwrap();
    for _ in 0..3 {
        engine.append(capped(&inbox, 5)).await.unwrap(); // trims 8..=10
    }
    assert_eq!(engine.stats().unacked_trimmed, 5, "8..=10 were acked by both");

    // A new device that starts from nothing: everything trimmed from now on
    // is unacked by it.
    engine.ack(&inbox, &sub("t", Some("new")), 0).await.unwrap();
    for _ in 0..2 {
        engine.append(capped(&inbox, 5)).await.unwrap(); // trims 11, 12
    }
    assert_eq!(engine.stats().unacked_trimmed, 7);
    engine.close().await;
}

/// The same count for age retention, and for a lowest cursor that moved
/// (acked) before the sweep.
#[tokio::test]
async fn unacked_messages_lost_to_max_age_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), |c| c.sweep_interval = Duration::from_millis(20));
    let ch = channel("user:age");
    let aged = || AppendRequest {
        retention: Retention { max_len: 0, max_age: Some(Duration::from_millis(200)) },
        ..req(&ch, "0")
    };
    for _ in 0..6 {
        engine.append(aged()).await.unwrap();
    }
    let (a, b) = (sub("age", Some("a")), sub("age", Some("b")));
    engine.ack(&ch, &a, 1).await.unwrap();
    engine.ack(&ch, &b, 4).await.unwrap();
    engine.ack(&ch, &a, 2).await.unwrap(); // the lowest cursor moves to 2
    assert_eventually("all six expired", || async { engine.position(&ch).await.unwrap().first == 7 }).await;
    let s = engine.stats();
    assert_eq!(s.expired, 6);
    assert_eq!(s.unacked_trimmed, 4, "3..=6 were unacked by `a`");
    engine.close().await;
}

#[tokio::test]
async fn acks_after_a_storage_failure_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), |_| {});
    let ch = channel("user:x");
    fill(&engine, &ch, 2).await;
    engine.ack(&ch, &sub("x", None), 1).await.unwrap();
    engine.inject_failure();
    let r = engine.ack(&ch, &sub("x", None), 2).await;
    assert!(matches!(r, Err(AckError::Engine(EngineError::Failed(_)))), "{r:?}");
    let r = engine.ack(&ch, &sub("x", None), 2).await;
    assert!(matches!(r, Err(AckError::Engine(EngineError::Failed(_)))), "refused from then on: {r:?}");
    assert_eq!(engine.cursor(&ch, &sub("x", None)).await.unwrap().map(|c| c.seq), Some(1), "reads work");
    engine.close().await;
    drop(engine);
    let engine = open(dir.path(), |_| {});
    assert_eq!(engine.cursor(&ch, &sub("x", None)).await.unwrap().map(|c| c.seq), Some(1));
}

#[tokio::test]
async fn ack_counters() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), |_| {});
    let ch = channel("user:c");
    fill(&engine, &ch, 5).await;
    let me = sub("c", None);
    engine.ack(&ch, &me, 3).await.unwrap();
    engine.ack(&ch, &me, 3).await.unwrap();
    engine.ack(&ch, &me, 1).await.unwrap();
    assert!(engine.ack(&ch, &me, 6).await.is_err());
    let s = engine.stats();
    assert_eq!((s.acks, s.acks_unchanged, s.acks_beyond_head, s.failed), (1, 2, 1, 0));
    assert_eq!(s.batch_requests, 5 + 4, "acks count as batched requests");
    engine.close().await;
}
