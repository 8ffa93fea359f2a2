//! Presence in the embedded engine: what survives a restart, what a
//! presence write costs in fsyncs, and how it behaves on a closed channel
//! or after a storage failure. (The engine-neutral semantics are in the
//! conformance suite.)

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{channel, open};
use herald_core::conformance::assert_eventually;
use herald_core::conformance::room_write;
use herald_core::{
    Engine, EngineError, Joined, Lease, Lifecycle, Member, Presence, Renewed, Room, RoomReason, RoomStatus,
    Rooms,
};

const DEADLINE: Duration = Duration::from_secs(20);
const LONG: Duration = Duration::from_secs(3600);

fn member(user: &str, client_id: &str) -> Member {
    Member {
        client_id: client_id.into(),
        user: user.into(),
        device: Some("phone".into()),
        info: Some(serde_json::json!({"name": user})),
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

async fn join(engine: &impl Engine, ch: &herald_proto::ChannelName, m: &Member, ttl: Duration) -> Lease {
    engine.presence_join(ch, m, ttl).await.unwrap().lease().clone()
}

/// Leases come back after a restart with their token and expiry, so the
/// leases of a dead process expire on time and are swept once.
#[tokio::test]
async fn leases_keep_their_token_and_expiry_across_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ch = channel("room:r1");
    let engine = open(dir.path(), |_| {});
    let brief = join(&engine, &ch, &member("ann", "c1"), Duration::from_millis(1500)).await;
    let stays = join(&engine, &ch, &member("bob", "c1"), LONG).await;
    let Renewed::Until(until) = engine.presence_renew(&ch, &stays.key(), stays.token, LONG).await.unwrap()
    else {
        panic!("renew");
    };
    let stays = Lease { expires_at_ms: until, ..stays };
    drop(engine); // without close: drop still persists

    let engine = open(dir.path(), |_| {});
    let listed = engine.presence(&ch, 10).await.unwrap();
    if now_ms() < brief.expires_at_ms {
        assert_eq!(listed, vec![brief.clone(), stays.clone()], "token, expiry and member survive");
    }
    for (_, lease) in engine.presence_expire(100).await.unwrap() {
        assert!(lease.expires_at_ms <= now_ms(), "only expired leases are swept: {lease:?}");
    }
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let swept = loop {
        let swept = engine.presence_expire(100).await.unwrap();
        if !swept.is_empty() {
            break swept;
        }
        assert!(tokio::time::Instant::now() < deadline, "the restored lease is never swept");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(now_ms() >= brief.expires_at_ms, "not before its expiry");
    assert_eq!(swept, vec![(ch.clone(), brief)], "swept once, as it was stored");
    assert!(engine.presence_expire(100).await.unwrap().is_empty());
    assert_eq!(engine.presence(&ch, 10).await.unwrap(), vec![stays.clone()]);
    let next = join(&engine, &ch, &member("cy", "c1"), LONG).await;
    assert!(next.token > stays.token, "the token counter continues");
    engine.close().await;
}

/// The token counter is stored apart from the leases: with every lease gone,
/// and across a restart, tokens keep growing.
#[tokio::test]
async fn tokens_keep_growing_across_restart_without_leases() {
    let dir = tempfile::tempdir().unwrap();
    let ch = channel("room:tokens");
    let m = member("dee", "c1");
    let engine = open(dir.path(), |_| {});
    let mut last = 0;
    for _ in 0..3 {
        let lease = join(&engine, &ch, &m, LONG).await;
        assert!(lease.token > last);
        last = lease.token;
        assert!(engine.presence_leave(&ch, &lease.key(), lease.token).await.unwrap().is_some());
    }
    engine.close().await;
    drop(engine);

    let engine = open(dir.path(), |_| {});
    assert_eq!(engine.presence_count(&ch).await.unwrap(), 0);
    match engine.presence_join(&ch, &m, LONG).await.unwrap() {
        Joined::New(lease) => assert!(lease.token > last, "token {} after {last}", lease.token),
        other => panic!("the member had left: {other:?}"),
    }
    engine.close().await;
}

/// Presence writes are committed like acks: no fsync of their own; the
/// ack-sync timer fsyncs them once, later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_writes_cost_no_fsync_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let ch = channel("room:f");
    let engine = open(dir.path(), |c| c.ack_sync_interval = Duration::from_secs(3600));
    let base = engine.stats().fsyncs;
    for i in 0..20 {
        let lease = join(&engine, &ch, &member("f", &format!("c{i}")), Duration::ZERO).await;
        engine.presence_renew(&ch, &lease.key(), lease.token, Duration::ZERO).await.unwrap();
    }
    let lease = join(&engine, &ch, &member("g", "c1"), LONG).await;
    engine.presence_leave(&ch, &lease.key(), lease.token).await.unwrap();
    let expired = engine.presence_expire(100).await.unwrap();
    assert_eq!(expired.len(), 20);
    let s = engine.stats();
    assert_eq!((s.presence_writes, s.presence_expired, s.fsyncs), (42, 20, base), "no fsync");
    engine.close().await;
    drop(engine);

    let engine = open(dir.path(), |c| c.ack_sync_interval = Duration::from_millis(100));
    let base = engine.stats().fsyncs;
    join(&engine, &ch, &member("h", "c1"), LONG).await;
    assert_eventually("the ack-sync timer fsyncs", || async { engine.stats().fsyncs == base + 1 }).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(engine.stats().fsyncs, base + 1, "no fsync while nothing waits for one");
    engine.close().await;
}

/// A closed room has no members: joins on its closed channel are refused,
/// and the leases removed by the close stay gone.
#[tokio::test]
async fn joins_on_a_closed_channel_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ch = channel("room:closed");
    let engine = open(dir.path(), |_| {});
    let room = Room::new("host".into(), Default::default(), 1_000, now_ms());
    engine.room_write(room_write(&ch, None, room.clone(), RoomReason::Created)).await.unwrap();
    let lease = join(&engine, &ch, &member("host", "c1"), LONG).await;
    let closed = room.change(Some(RoomStatus::Closed), None, now_ms()).unwrap();
    engine.room_write(room_write(&ch, Some(&room), closed, RoomReason::Api)).await.unwrap();

    assert_eq!(engine.presence_join(&ch, &member("late", "c1"), LONG).await, Err(EngineError::Closed));
    assert_eq!(engine.presence_join(&ch, &lease.member, LONG).await, Err(EngineError::Closed));
    assert_eq!(
        engine.presence_renew(&ch, &lease.key(), lease.token, LONG).await.unwrap(),
        Renewed::Gone,
        "the close removed the lease"
    );
    assert!(engine.presence(&ch, 10).await.unwrap().is_empty());
    assert_eq!(engine.stats().closed_refused, 2);
    engine.close().await;
}

#[tokio::test]
async fn presence_writes_after_a_storage_failure_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ch = channel("room:x");
    let engine = open(dir.path(), |_| {});
    let lease = join(&engine, &ch, &member("x", "c1"), LONG).await;
    engine.inject_failure();
    let r = engine.presence_renew(&ch, &lease.key(), lease.token, LONG).await;
    assert!(matches!(r, Err(EngineError::Failed(_))), "{r:?}");
    let r = engine.presence_join(&ch, &member("y", "c1"), LONG).await;
    assert!(matches!(r, Err(EngineError::Failed(_))), "refused from then on: {r:?}");
    assert!(matches!(engine.presence_expire(10).await, Err(EngineError::Failed(_))));
    assert_eq!(engine.presence(&ch, 10).await.unwrap(), vec![lease.clone()], "reads work, nothing changed");
    engine.close().await;
    drop(engine);
    let engine = open(dir.path(), |_| {});
    assert_eq!(engine.presence(&ch, 10).await.unwrap(), vec![lease]);
}
