//! Room scenarios: create, compare-and-set, the event log, closing.

use std::sync::Arc;

use herald_proto::{ChannelName, FrameKind, MessageView};
use serde_json::{json, Map, Value};

use super::{now_ms, request, Fixture, LONG_TTL};
use crate::engine::{AppendRequest, EngineError, Message, Receipt, Retention, RoomWrite, RoomWritten};
use crate::presence::Joined;
use crate::room::{Room, RoomReason, RoomStatus};

fn attrs(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("attributes are an object"),
    }
}

/// The write taking the room from `from` (`None`: create) to `room`, with
/// its event as the contract shapes it.
pub fn room_write(channel: &ChannelName, from: Option<&Room>, room: Room, reason: RoomReason) -> RoomWrite {
    let data = serde_json::value::to_raw_value(&room.event(reason)).expect("room events serialise");
    let closing = room.state == RoomStatus::Closed;
    let event = AppendRequest {
        kind: FrameKind::Room,
        closes: closing,
        ..AppendRequest::message(channel.clone(), data, true, Retention { max_len: 0, max_age: None })
    };
    RoomWrite { expected_version: from.map(|r| r.version), room, event }
}

async fn written(fx: &Fixture, write: RoomWrite) -> (Room, Receipt) {
    match fx.engine.room_write(write).await.expect("room write") {
        RoomWritten::Written { room, receipt } => (room, receipt),
        RoomWritten::Conflict { current } => panic!("unexpected conflict; current {current:?}"),
    }
}

async fn create(fx: &Fixture, ch: &ChannelName) -> (Room, Receipt) {
    let room = Room::new(fx.user("host"), attrs(json!({"title": "t"})), 60_000, now_ms());
    written(fx, room_write(ch, None, room, RoomReason::Created)).await
}

async fn change(
    fx: &Fixture,
    ch: &ChannelName,
    from: &Room,
    to: Option<RoomStatus>,
    a: Option<Value>,
) -> (Room, Receipt) {
    let next = from.change(to, a.map(attrs), now_ms()).expect("legal change");
    written(fx, room_write(ch, Some(from), next, RoomReason::Api)).await
}

fn view(m: &Message) -> MessageView {
    MessageView::parse(&m.frame).expect("frame is JSON")
}

/// The `version` of a room event frame.
fn event_version(m: &Message) -> u64 {
    let v = view(m);
    assert_eq!(v.kind, "room", "seq {:?} is a room event", m.seq);
    let data: Value = serde_json::from_str(v.data.expect("room events have data").get()).expect("data");
    data["version"].as_u64().expect("room events carry the version")
}

/// Creating a room that exists, updating one that does not, and updating
/// with a stale version are conflicts that change and append nothing.
pub async fn room_create_conflicts_with_an_existing_room(fx: &Fixture) {
    let (ch, missing) = (fx.channel("room-a"), fx.channel("room-none"));
    assert_eq!(fx.engine.room(&ch).await.expect("room"), None);
    let (room, receipt) = create(fx, &ch).await;
    assert_eq!((room.version, room.state), (1, RoomStatus::Open));
    assert_eq!((&receipt.channel, receipt.seq, receipt.duplicate), (&ch, Some(1), false));
    assert_eq!(fx.engine.room(&ch).await.expect("room"), Some(room.clone()));

    let rival = Room::new(fx.user("rival"), Map::new(), 1_000, now_ms());
    match fx.engine.room_write(room_write(&ch, None, rival, RoomReason::Created)).await.expect("write") {
        RoomWritten::Conflict { current } => assert_eq!(current, Some(room.clone()), "the stored room"),
        other => panic!("a second create conflicts, got {other:?}"),
    }
    let next = room.change(Some(RoomStatus::Live), None, now_ms()).expect("legal");
    let stale = RoomWrite {
        expected_version: Some(7),
        ..room_write(&ch, Some(&room), next.clone(), RoomReason::Api)
    };
    match fx.engine.room_write(stale).await.expect("write") {
        RoomWritten::Conflict { current } => assert_eq!(current, Some(room.clone())),
        other => panic!("a wrong version conflicts, got {other:?}"),
    }
    match fx.engine.room_write(room_write(&missing, Some(&room), next, RoomReason::Api)).await.expect("write")
    {
        RoomWritten::Conflict { current } => assert_eq!(current, None, "no room there"),
        other => panic!("updating a missing room conflicts, got {other:?}"),
    }
    assert_eq!(fx.engine.room(&ch).await.expect("room"), Some(room.clone()), "conflicts change nothing");
    assert_eq!(fx.engine.room(&missing).await.expect("room"), None, "an update never creates");
    assert_eq!(fx.engine.position(&ch).await.expect("position").head, 1, "conflicts append nothing");
    assert_eq!(fx.engine.position(&missing).await.expect("position").head, 0);
    assert_eq!(fx.active_rooms().await, vec![(ch, room)]);
}

/// 50 writers racing from the same version: exactly one wins, the others
/// see its record, and the log holds one event per version.
pub async fn room_cas_admits_one_writer_per_version(fx: &Fixture) {
    const WRITERS: usize = 50;
    let ch = fx.channel("room-race");
    let (v1, _) = create(fx, &ch).await;
    let tasks: Vec<_> = (0..WRITERS)
        .map(|i| {
            let (engine, ch, v1) = (fx.engine.clone(), ch.clone(), v1.clone());
            tokio::spawn(async move {
                let next = v1.change(None, Some(attrs(json!({"writer": i}))), now_ms()).expect("legal");
                engine.room_write(room_write(&ch, Some(&v1), next, RoomReason::Api)).await
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut seen = Vec::new();
    for t in futures_util::future::join_all(tasks).await {
        match t.expect("task").expect("room write") {
            RoomWritten::Written { room, receipt } => winners.push((room, receipt)),
            RoomWritten::Conflict { current } => seen.push(current.expect("the room exists")),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one writer per version");
    let (winner, receipt) = winners.remove(0);
    assert_eq!((winner.version, receipt.seq), (2, Some(2)));
    assert!(seen.iter().all(|r| r == &winner), "every loser sees the winner's record");
    assert_eq!(fx.engine.room(&ch).await.expect("room"), Some(winner));
    let log = fx.engine.read(&ch, 0, 100).await.expect("read");
    assert_eq!(log.messages.iter().map(|m| event_version(m)).collect::<Vec<_>>(), vec![1, 2]);
}

/// A chain of writes gives versions 1, 2, 3, ... with one room event per
/// version in the room's log, in version order, between the app messages
/// appended between the writes; fan-out carries the same sequence.
pub async fn room_versions_are_logged_in_order_with_messages(fx: &Fixture) {
    let ch = fx.channel("room-log");
    fx.watch(&ch).await;
    // What each seq must be: a room event's version or an app message's data.
    let mut expected: Vec<(u64, Result<u64, String>)> = Vec::new();
    let (mut room, r) = create(fx, &ch).await;
    expected.push((r.seq.expect("seq"), Ok(1)));
    let steps: [(&[&str], Option<RoomStatus>, Option<Value>); 5] = [
        (&["\"a\""], None, Some(json!({"title": "u"}))),
        (&["\"b\"", "\"c\""], Some(RoomStatus::Live), None),
        (&[], Some(RoomStatus::Grace), None),
        (&["\"d\""], Some(RoomStatus::Live), None),
        (&["\"e\""], None, Some(json!({}))),
    ];
    for (messages, to, a) in steps {
        for data in messages {
            let r = fx.engine.append(request(&ch, data)).await.expect("append");
            expected.push((r.seq.expect("seq"), Err((*data).to_owned())));
        }
        let (next, r) = change(fx, &ch, &room, to, a).await;
        assert_eq!(next.version, room.version + 1, "every write bumps the version by one");
        expected.push((r.seq.expect("seq"), Ok(next.version)));
        room = next;
    }
    assert_eq!(room.version, 6);
    assert_eq!(fx.engine.room(&ch).await.expect("room"), Some(room.clone()));
    let seqs: Vec<u64> = expected.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, (1..=expected.len() as u64).collect::<Vec<_>>(), "events take seqs like messages");

    let check = |messages: &[Arc<Message>], what: &str| {
        assert_eq!(messages.len(), expected.len(), "{what}");
        for (m, (seq, body)) in messages.iter().zip(&expected) {
            assert_eq!(m.seq, Some(*seq), "{what}");
            assert!(!m.closes, "{what}: seq {seq} does not close the channel");
            match body {
                Ok(version) => assert_eq!(event_version(m), *version, "{what}: seq {seq}"),
                Err(data) => {
                    let v = view(m);
                    assert_eq!(
                        (v.kind.as_str(), v.data.expect("data").get()),
                        ("message", data.as_str()),
                        "{what}"
                    );
                }
            }
        }
    };
    check(&fx.engine.read(&ch, 0, 100).await.expect("read").messages, "the log");
    check(&fx.sink.wait_for(&ch, expected.len()).await, "fan-out");
    let grace = fx.engine.read(&ch, 0, 100).await.expect("read").messages[6].clone();
    let data: Value = serde_json::from_str(view(&grace).data.expect("data").get()).expect("json");
    assert_eq!(data["state"], "grace");
    assert!(data["grace_until_ms"].as_u64().is_some(), "the grace deadline is in the event");
}

/// Closing a room closes its channel in the same step: the closing event is
/// the channel's last message (`closes` on fan-out and read), every later
/// append is refused, every lease of the channel is gone (leases elsewhere
/// stay), the room leaves `rooms_active`, and no write reopens it.
pub async fn closing_a_room_closes_its_channel(fx: &Fixture) {
    let (ch, open_room, elsewhere) = (fx.channel("room-end"), fx.channel("room-open"), fx.channel("room-x"));
    fx.watch(&ch).await;
    let (room, _) = create(fx, &ch).await;
    let (other_room, _) = create(fx, &open_room).await;
    let mut leases = Vec::new();
    for (user, client) in [("host", "c1"), ("guest", "c1"), ("guest", "c2")] {
        match fx.engine.presence_join(&ch, &fx.member(user, client), LONG_TTL).await.expect("join") {
            Joined::New(lease) => leases.push(lease),
            other => panic!("a first join is new, got {other:?}"),
        }
    }
    let outside =
        fx.engine.presence_join(&elsewhere, &fx.member("guest", "c1"), LONG_TTL).await.expect("join");
    fx.engine.append(request(&ch, "\"bye\"")).await.expect("append");

    let (closed, receipt) = change(fx, &ch, &room, Some(RoomStatus::Closed), None).await;
    assert_eq!((closed.state, closed.version, receipt.seq), (RoomStatus::Closed, 2, Some(3)));

    let pos = fx.engine.position(&ch).await.expect("position");
    assert_eq!((pos.head, pos.closed), (3, true), "closed at the closing event");
    assert_eq!(fx.engine.append(request(&ch, "1")).await, Err(EngineError::Closed), "no durable append");
    let volatile = AppendRequest { durable: false, ..request(&ch, "2") };
    assert_eq!(fx.engine.append(volatile).await, Err(EngineError::Closed), "no volatile append");
    assert_eq!(fx.engine.position(&ch).await.expect("position").head, 3);
    assert!(!fx.engine.position(&open_room).await.expect("position").closed, "other channels stay open");

    let log = fx.engine.read(&ch, 0, 100).await.expect("read").messages;
    assert_eq!(log.iter().map(|m| m.closes).collect::<Vec<_>>(), vec![false, false, true], "read back");
    let last = view(&log[2]);
    assert_eq!(last.kind, "room");
    let data: Value = serde_json::from_str(last.data.expect("data").get()).expect("json");
    assert_eq!(data["state"], "closed");
    let live = fx.sink.wait_for(&ch, 3).await;
    assert_eq!(live.iter().map(|m| m.closes).collect::<Vec<_>>(), vec![false, false, true], "fan-out");
    assert_eq!(live[2].frame, log[2].frame);

    assert!(fx.engine.presence(&ch, 10).await.expect("presence").is_empty(), "no members");
    assert_eq!(fx.engine.presence_count(&ch).await.expect("count"), 0);
    assert!(!fx.engine.presence_has_user(&ch, &fx.user("guest")).await.expect("has_user"));
    for lease in &leases {
        let r = fx.engine.presence_rejoin(&ch, &lease.member, lease.token, LONG_TTL).await;
        assert_eq!(r, Err(EngineError::Closed), "no rejoin on a closed room");
        assert_eq!(fx.engine.presence_leave(&ch, &lease.key(), lease.token).await.expect("leave"), None);
    }
    assert_eq!(
        fx.engine.presence(&elsewhere, 10).await.expect("presence"),
        vec![outside.lease().clone()],
        "leases of other channels stay"
    );

    assert_eq!(fx.engine.room(&ch).await.expect("room"), Some(closed.clone()));
    assert_eq!(fx.active_rooms().await, vec![(open_room, other_room)], "closed rooms are not active");

    // Nothing reopens it, even a write that passes the version check.
    let reopened = Room { state: RoomStatus::Live, version: closed.version + 1, ..closed.clone() };
    let r = fx.engine.room_write(room_write(&ch, Some(&closed), reopened, RoomReason::Api)).await;
    assert!(!matches!(r, Ok(RoomWritten::Written { .. })), "a closed channel takes no event: {r:?}");
    assert_eq!(fx.engine.room(&ch).await.expect("room"), Some(closed));
    assert_eq!(fx.engine.position(&ch).await.expect("position").head, 3);
}
