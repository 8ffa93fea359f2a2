//! Rooms in the embedded engine: what survives a restart and what a room
//! write costs in fsyncs. (The engine-neutral semantics are in the
//! conformance suite.)

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use common::{channel, open, req};
use herald_core::conformance::room_write;
use herald_core::{
    Engine, EngineError, Lifecycle, Log, Room, RoomReason, RoomStatus, RoomWrite, RoomWritten, Rooms,
};
use herald_proto::ChannelName;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

async fn write(engine: &impl Engine, w: RoomWrite) -> Room {
    match engine.room_write(w).await.unwrap() {
        RoomWritten::Written { room, .. } => room,
        RoomWritten::Conflict { current } => panic!("conflict with {current:?}"),
    }
}

async fn create(engine: &impl Engine, ch: &ChannelName, grace_ms: u64) -> Room {
    let room = Room::new("host".into(), Default::default(), grace_ms, now_ms());
    write(engine, room_write(ch, None, room, RoomReason::Created)).await
}

async fn change(engine: &impl Engine, ch: &ChannelName, from: &Room, to: RoomStatus) -> Room {
    let next = from.change(Some(to), None, now_ms()).unwrap();
    write(engine, room_write(ch, Some(from), next, RoomReason::Api)).await
}

/// Room records (with their grace deadline), the active index and the
/// closed flag of closed rooms' channels all come back after a restart.
#[tokio::test]
async fn rooms_and_closed_channels_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (waiting, ended) = (channel("room:waiting"), channel("room:ended"));
    let engine = open(dir.path(), |_| {});
    let r = create(&engine, &waiting, 60_000).await;
    let r = change(&engine, &waiting, &r, RoomStatus::Live).await;
    let grace = change(&engine, &waiting, &r, RoomStatus::Grace).await;
    assert!(grace.grace_until_ms.is_some());
    let e = create(&engine, &ended, 1_000).await;
    engine.append(req(&ended, "\"last words\"")).await.unwrap();
    let closed = change(&engine, &ended, &e, RoomStatus::Closed).await;
    drop(engine); // without close: drop still persists

    let engine = open(dir.path(), |_| {});
    assert_eq!(engine.room(&waiting).await.unwrap(), Some(grace.clone()), "state and grace deadline");
    assert_eq!(engine.room(&ended).await.unwrap(), Some(closed));
    assert_eq!(engine.rooms_active(None, 10).await.unwrap(), vec![(waiting.clone(), grace.clone())]);
    let pos = engine.position(&ended).await.unwrap();
    assert_eq!((pos.head, pos.closed), (3, true), "closed for good");
    assert_eq!(engine.append(req(&ended, "1")).await, Err(EngineError::Closed));
    let log = engine.read(&ended, 0, 10).await.unwrap().messages;
    assert_eq!(log.iter().map(|m| m.closes).collect::<Vec<_>>(), vec![false, false, true]);

    let back = change(&engine, &waiting, &grace, RoomStatus::Live).await;
    assert_eq!(back.version, 4, "versions continue");
    assert_eq!(engine.position(&waiting).await.unwrap().head, 4, "one event per version");
    assert!(!engine.position(&waiting).await.unwrap().closed);
    engine.close().await;
}

/// A room write is an append: its batch is fsynced before the reply. A
/// conflict writes nothing and costs nothing.
#[tokio::test]
async fn room_writes_are_fsynced_like_appends() {
    let dir = tempfile::tempdir().unwrap();
    let ch = channel("room:sync");
    let engine = open(dir.path(), |_| {});
    let base = engine.stats().fsyncs;
    let room = create(&engine, &ch, 1_000).await;
    assert_eq!(engine.stats().fsyncs, base + 1);
    let stale = room.change(Some(RoomStatus::Live), None, now_ms()).unwrap();
    let r = engine.room_write(room_write(&ch, None, stale, RoomReason::Created)).await.unwrap();
    assert!(matches!(r, RoomWritten::Conflict { current: Some(_) }));
    let s = engine.stats();
    assert_eq!((s.fsyncs, s.room_writes, s.room_conflicts), (base + 1, 1, 1), "a conflict costs no fsync");
    engine.close().await;
}

/// `rooms_active` pages by name, and a room that closes leaves it.
#[tokio::test]
async fn rooms_active_pages_in_name_order() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), |_| {});
    let names: Vec<ChannelName> = ["room:c", "room:a", "room:e", "room:b", "room:d"].map(channel).to_vec();
    let mut rooms = Vec::new();
    for ch in &names {
        rooms.push((ch.clone(), create(&engine, ch, 1_000).await));
    }
    let closed = change(&engine, &names[3], &rooms[3].1, RoomStatus::Closed).await; // room:b
    assert_eq!(closed.state, RoomStatus::Closed);
    let page1 = engine.rooms_active(None, 2).await.unwrap();
    let page2 = engine.rooms_active(Some(&page1[1].0), 2).await.unwrap();
    let page3 = engine.rooms_active(Some(&page2[1].0), 2).await.unwrap();
    let listed: Vec<&str> = page1.iter().chain(&page2).chain(&page3).map(|(c, _)| c.as_str()).collect();
    assert_eq!(listed, ["room:a", "room:c", "room:d", "room:e"]);
    assert!(engine.rooms_active(Some(&channel("room:e")), 2).await.unwrap().is_empty());
    assert!(engine.rooms_active(None, 0).await.unwrap().is_empty());
    engine.close().await;
}
