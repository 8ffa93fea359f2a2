//! Schedule scenarios: order, dedup, cancel, fencing, delivery once.

use std::time::Duration;

use herald_proto::{ChannelName, MessageView};
use serde_json::value::RawValue;

use super::{now_ms, request, Fixture, LONG_TTL};
use crate::engine::{
    AppendRequest, Claim, Delivered, EngineError, Schedule, ScheduleReceipt, ScheduleRequest,
};

fn sched(channel: &ChannelName, deliver_at: u64, data: &str) -> ScheduleRequest {
    ScheduleRequest {
        channel: channel.clone(),
        deliver_at,
        data: RawValue::from_string(data.to_owned()).expect("scenario data is valid JSON"),
        meta: None,
        dedup: None,
    }
}

async fn add(fx: &Fixture, req: ScheduleRequest) -> ScheduleReceipt {
    fx.engine.schedule(req).await.expect("schedule")
}

/// This fixture's due claims (the due index is global).
async fn claim(fx: &Fixture, lease: Duration) -> Vec<Claim> {
    let own = fx.channel("");
    let all = fx.engine.schedules_claim(now_ms() + 1, 1000, lease).await.expect("claim");
    all.into_iter().filter(|c| c.schedule.channel.as_str().starts_with(own.as_str())).collect()
}

async fn deliver(fx: &Fixture, c: &Claim) -> Delivered {
    let s = &c.schedule;
    let req = request(&s.channel, s.data.get());
    fx.engine.schedule_deliver(c, req).await.expect("deliver")
}

fn ids(list: &[Schedule]) -> Vec<&str> {
    list.iter().map(|s| &*s.id).collect()
}

async fn datas(fx: &Fixture, ch: &ChannelName) -> Vec<String> {
    let page = fx.engine.read(ch, 0, 100).await.expect("read");
    page.messages
        .iter()
        .map(|m| MessageView::parse(&m.frame).expect("frame").data.expect("data").get().to_owned())
        .collect()
}

/// Schedules are listed and claimed in `(deliver_at, schedule order)`
/// order; each due one is appended once with its data, a second delivery
/// of the same claim appends nothing, and future ones stay pending.
pub async fn schedules_are_claimed_in_order_and_delivered_once(fx: &Fixture) {
    let ch = fx.channel("sched");
    let t = now_ms();
    let later = add(fx, sched(&ch, t - 1000, "2")).await;
    let first = add(fx, sched(&ch, t - 2000, "1")).await;
    let tie = add(fx, sched(&ch, t - 1000, "3")).await;
    let future = add(fx, sched(&ch, t + 3_600_000, "4")).await;
    assert!(!first.duplicate && first.deliver_at == t - 2000 && first.channel == ch);
    let listed = fx.engine.scheduled(&ch, 10).await.expect("list");
    assert_eq!(ids(&listed), [&*first.id, &*later.id, &*tie.id, &*future.id]);
    assert_eq!(listed[0].size(), 1);
    assert_eq!(ids(&fx.engine.scheduled(&ch, 2).await.expect("list")), [&*first.id, &*later.id]);
    assert!(fx.engine.schedules_pending().await.expect("pending") >= 4);

    let claims = claim(fx, LONG_TTL).await;
    let claimed: Vec<&str> = claims.iter().map(|c| &*c.schedule.id).collect();
    assert_eq!(claimed, [&*first.id, &*later.id, &*tie.id], "due ones, in order");
    assert!(claim(fx, LONG_TTL).await.is_empty(), "claimed ones are not handed out again");
    for (i, c) in claims.iter().enumerate() {
        match deliver(fx, c).await {
            Delivered::Appended(r) => assert_eq!(r.seq, Some(i as u64 + 1)),
            Delivered::Stale => panic!("a fresh claim delivers"),
        }
        assert!(matches!(deliver(fx, c).await, Delivered::Stale), "delivered once");
    }
    assert_eq!(datas(fx, &ch).await, ["1", "2", "3"]);
    assert_eq!(ids(&fx.engine.scheduled(&ch, 10).await.expect("list")), [&*future.id]);
    assert!(fx.engine.schedule_cancel(&first.id).await.expect("cancel").is_none(), "delivered is gone");
    let next = fx.engine.schedule_next().await.expect("next").expect("one pending");
    assert!(next <= t + 3_600_000);
    // One earlier than everything claimed so far is still found.
    let earliest = add(fx, sched(&ch, t - 5000, "0")).await;
    let claims = claim(fx, LONG_TTL).await;
    let claimed: Vec<&str> = claims.iter().map(|c| &*c.schedule.id).collect();
    assert_eq!(claimed, [&*earliest.id], "a schedule earlier than the ones delivered");
    assert!(matches!(deliver(fx, &claims[0]).await, Delivered::Appended(_)));
}

/// An idempotency key schedules once: the same request again gets the
/// original receipt, another request under the key is a mismatch.
pub async fn schedule_dedup_returns_the_original_receipt(fx: &Fixture) {
    let ch = fx.channel("dedup");
    let at = now_ms() + 3_600_000;
    let mk = |fp: u8| ScheduleRequest { dedup: Some(fx.dedup("s", fp)), ..sched(&ch, at, "1") };
    let a = add(fx, mk(1)).await;
    let b = add(fx, mk(1)).await;
    assert!(!a.duplicate && b.duplicate);
    assert_eq!((&a.id, a.deliver_at, &a.channel), (&b.id, b.deliver_at, &b.channel));
    assert_eq!(fx.engine.schedule(mk(2)).await.unwrap_err(), EngineError::IdempotencyMismatch);
    assert_eq!(fx.engine.scheduled(&ch, 10).await.expect("list").len(), 1);
}

/// A cancelled schedule is never delivered, also by a claim taken before
/// the cancel; cancelling twice finds nothing.
pub async fn cancelled_schedules_are_never_delivered(fx: &Fixture) {
    let ch = fx.channel("cancel");
    let r = add(fx, sched(&ch, now_ms() - 10, "1")).await;
    let claims = claim(fx, LONG_TTL).await;
    assert_eq!(claims.len(), 1);
    let gone = fx.engine.schedule_cancel(&r.id).await.expect("cancel").expect("was pending");
    assert_eq!((&gone.id, &gone.channel, gone.data.get()), (&r.id, &ch, "1"));
    assert!(matches!(deliver(fx, &claims[0]).await, Delivered::Stale));
    assert!(fx.engine.schedule_cancel(&r.id).await.expect("cancel").is_none());
    assert!(fx.engine.schedule_cancel("no-such-schedule").await.expect("cancel").is_none());
    assert_eq!(fx.engine.position(&ch).await.expect("position").head, 0, "nothing appended");
    assert!(fx.engine.scheduled(&ch, 10).await.expect("list").is_empty());
}

/// A claim whose lease ran out is taken again with a greater token, and the
/// earlier claim can no longer deliver (a paused node's late claim appends
/// nothing).
pub async fn a_later_claim_fences_off_an_earlier_one(fx: &Fixture) {
    let ch = fx.channel("fence");
    add(fx, sched(&ch, now_ms() - 10, "1")).await;
    let lease = Duration::from_millis(200);
    let old = claim(fx, lease).await;
    assert_eq!(old.len(), 1);
    // The lease runs out, then the schedule is claimed again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let new = loop {
        let got = claim(fx, LONG_TTL).await;
        if !got.is_empty() {
            break got;
        }
        assert!(tokio::time::Instant::now() < deadline, "an expired claim is claimed again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(new[0].token > old[0].token, "tokens grow");
    assert!(matches!(deliver(fx, &old[0]).await, Delivered::Stale), "the stale claim appends nothing");
    assert!(matches!(deliver(fx, &new[0]).await, Delivered::Appended(_)));
    assert_eq!(fx.engine.position(&ch).await.expect("position").head, 1);
}

/// A delivered schedule's frame, durable or volatile, is the one the
/// receipt describes: fanned out with its seq (none when volatile), id, ts
/// and data, and a durable one stored as it was fanned out.
pub async fn delivered_schedules_are_fanned_out_with_their_frames(fx: &Fixture) {
    let ch = fx.channel("sched-frames");
    fx.watch(&ch).await;
    let t = now_ms();
    add(fx, sched(&ch, t - 2000, r#"{"n":1}"#)).await;
    add(fx, sched(&ch, t - 1000, r#"{"n":2}"#)).await;
    let claims = claim(fx, Duration::from_secs(60)).await;
    assert_eq!(claims.len(), 2);
    let mut receipts = Vec::new();
    for (c, durable) in claims.iter().zip([true, false]) {
        let req = AppendRequest { durable, ..request(&c.schedule.channel, c.schedule.data.get()) };
        match fx.engine.schedule_deliver(c, req).await.expect("deliver") {
            Delivered::Appended(r) => receipts.push(r),
            other => panic!("not appended: {other:?}"),
        }
    }
    let got = fx.sink.wait_for(&ch, 2).await;
    for ((m, r), data) in got.iter().zip(&receipts).zip([r#"{"n":1}"#, r#"{"n":2}"#]) {
        let view = MessageView::parse(&m.frame).expect("frame");
        assert_eq!((view.seq, view.id.as_deref(), view.ts), (r.seq, Some(&*r.id), Some(r.ts)));
        assert_eq!(view.channel.as_deref(), Some(ch.as_str()));
        assert_eq!(view.data.expect("data").get(), data);
    }
    assert_eq!((receipts[0].seq, receipts[1].seq), (Some(1), None));
    let stored = fx.engine.read(&ch, 0, 10).await.expect("read").messages;
    assert_eq!(stored.len(), 1, "the volatile delivery is not stored");
    assert_eq!(stored[0].frame, got[0].frame, "stored as fanned out");
}
