use std::collections::VecDeque;

use bytes::Bytes;
use herald_proto::ChannelName;
use proptest::prelude::*;

use super::*;

fn ch() -> ChannelName {
    ChannelName::new("chat:feed").unwrap()
}

fn id(epoch: &str, seq: Seq) -> Arc<str> {
    Arc::from(format!("{epoch}-{seq}"))
}

fn msg(epoch: &str, seq: Seq) -> Arc<Message> {
    Arc::new(Message {
        channel: ch(),
        seq: Some(seq),
        id: id(epoch, seq),
        ts: 0,
        epoch: Epoch::new(epoch),
        frame: Bytes::new(),
        closes: false,
    })
}

fn pos(epoch: &str, first: Seq, head: Seq) -> Position {
    Position { epoch: Epoch::new(epoch), first, head, closed: false }
}

/// The log's answer to `round`: its position and the messages after
/// `round.after`, from `first` to `head`.
fn page(round: &Round, epoch: &str, first: Seq, head: Seq) -> (Position, Vec<Arc<Message>>) {
    let from = (round.after + 1).max(first);
    let to = head.min(round.after + round.limit as Seq);
    (pos(epoch, first, head), (from..=to).map(|s| msg(epoch, s)).collect())
}

/// Run rounds against a log in `epoch` at `first..=head` until the repair
/// is done; returns the released seqs and the steps.
fn repair(feed: &mut Feed, epoch: &str, first: Seq, head: Seq, limit: usize) -> (Vec<Seq>, Vec<Step>) {
    let (mut released, mut steps) = (Vec::new(), Vec::new());
    for _ in 0..100 {
        let round = feed.round(limit);
        let (p, msgs) = page(&round, epoch, first, head);
        let step = feed.on_page(&round, &p, &msgs, |m| released.push(m.seq.unwrap()));
        steps.push(step.clone());
        if let Step::Released { done: true, .. } = step {
            feed.end_repair();
            return (released, steps);
        }
    }
    panic!("the repair did not end: {steps:?}");
}

#[test]
fn live_messages_go_out_in_order_and_a_gap_is_filled_from_the_log() {
    let mut feed = Feed::new();
    assert_eq!(feed.offer(1, "E", &id("E", 1)), Offered::Skip, "not started: skipped");
    assert!(!feed.start(&pos("E", 1, 0)), "an empty log needs no repair");
    assert_eq!(feed.offer(1, "E", &id("E", 1)), Offered::Release);
    assert_eq!(feed.offer(1, "E", &id("E", 1)), Offered::Skip, "duplicate");
    assert_eq!(feed.offer(2, "E", &id("E", 2)), Offered::Release);
    assert_eq!(feed.offer(5, "E", &id("E", 5)), Offered::Repair { gap: true });
    assert!(feed.is_repairing());
    assert_eq!(feed.offer(6, "E", &id("E", 6)), Offered::Skip, "the running repair covers it");
    let (released, _) = repair(&mut feed, "E", 1, 6, 2);
    assert_eq!(released, [3, 4, 5, 6], "in order, from the log, in pages of 2");
    assert_eq!((feed.last(), feed.is_repairing()), (6, false));
    assert_eq!(feed.offer(7, "E", &id("E", 7)), Offered::Release);
}

#[test]
fn a_started_feed_hands_out_the_head_message_once() {
    let mut feed = Feed::new();
    assert!(feed.start(&pos("E", 1, 4)), "starts one before the head, repairs");
    assert_eq!(feed.last(), 3);
    assert!(!feed.start(&pos("E", 1, 9)), "a started feed ignores a later start");
    let (released, _) = repair(&mut feed, "E", 1, 4, 256);
    assert_eq!(released, [4]);
    // A repair asked for before the start reads the position itself.
    let mut feed = Feed::new();
    assert!(!feed.recheck(), "nothing to recheck before the start");
    assert!(feed.request_repair());
    let (released, steps) = repair(&mut feed, "E", 1, 4, 256);
    assert_eq!(steps[0], Step::Started);
    assert_eq!(released, [4]);
}

#[test]
fn a_live_message_of_another_epoch_makes_the_feed_follow_the_log() {
    let mut feed = Feed::new();
    feed.start(&pos("E", 1, 0));
    for s in 1..=3 {
        assert_eq!(feed.offer(s, "E", &id("E", s)), Offered::Release);
    }
    assert_eq!(feed.offer(1, "F", &id("F", 1)), Offered::Repair { gap: false });
    let (released, steps) = repair(&mut feed, "F", 1, 1, 256);
    assert_eq!(
        steps[0],
        Step::NewEpoch { epoch: Epoch::new("F"), previous: Epoch::new("E"), lost: true },
        "the new log's head is below what was released"
    );
    assert_eq!(released, [1], "then the new epoch's head message");
    assert_eq!(feed.epoch(), Some(&Epoch::new("F")));
    assert_eq!(feed.offer(2, "F", &id("F", 2)), Offered::Release);
}

#[test]
fn a_log_that_lost_what_was_released_under_the_same_epoch_is_reported() {
    let mut feed = Feed::new();
    feed.start(&pos("E", 1, 0));
    for s in 1..=3 {
        feed.offer(s, "E", &id("E", s));
    }
    assert!(feed.request_repair());
    // The log's head went back to 2.
    let round = feed.round(256);
    let (p, msgs) = page(&round, "E", 1, 2);
    let step = feed.on_page(&round, &p, &msgs, |_| panic!("nothing is released"));
    assert_eq!(step, Step::Lost { epoch: Epoch::new("E"), head: 2 });
    assert_eq!(feed.last(), 3, "the feed waits for the new epoch");
    feed.follow(Epoch::new("G"), 2);
    let (released, _) = repair(&mut feed, "G", 1, 2, 256);
    assert_eq!(released, [2]);

    // Same head, but the message at `last` is another one.
    let mut feed = Feed::new();
    feed.start(&pos("E", 1, 0));
    feed.offer(1, "E", &Arc::from("original"));
    assert!(feed.request_repair());
    let round = feed.round(256);
    let (p, msgs) = page(&round, "E", 1, 1);
    assert_eq!(feed.on_page(&round, &p, &msgs, |_| {}), Step::Lost { epoch: Epoch::new("E"), head: 1 });
}

/// A repair asked for before the start (the periodic check) whose page
/// comes back after `start` and a live release: the page must not start
/// the feed again (that handed the head message out twice).
#[test]
fn a_start_round_overtaken_by_the_start_releases_nothing_twice() {
    let mut feed = Feed::new();
    assert!(feed.request_repair());
    let round = feed.round(256);
    assert!(!feed.start(&pos("E", 1, 0)), "a repair is already running");
    assert_eq!(feed.offer(1, "E", &id("E", 1)), Offered::Release);
    let (p, msgs) = page(&round, "E", 1, 1);
    assert_eq!(feed.on_page(&round, &p, &msgs, |_| panic!("seq 1 went out live")), Step::Stale);
    assert_eq!(feed.last(), 1);
    let (released, _) = repair(&mut feed, "E", 1, 2, 256);
    assert_eq!(released, [2], "the next round goes on after what went out");
}

#[test]
fn a_page_of_a_round_overtaken_by_an_epoch_change_releases_nothing() {
    let mut feed = Feed::new();
    feed.start(&pos("E", 1, 0));
    feed.request_repair();
    let round = feed.round(256);
    feed.follow(Epoch::new("F"), 0);
    let (p, msgs) = page(&round, "E", 1, 2);
    assert_eq!(feed.on_page(&round, &p, &msgs, |_| panic!("stale")), Step::Stale);
}

#[test]
fn a_round_asked_for_meanwhile_keeps_the_repair_going() {
    let mut feed = Feed::new();
    feed.start(&pos("E", 1, 0));
    feed.request_repair();
    let round = feed.round(256);
    assert!(!feed.recheck(), "a repair runs: it makes another round");
    let (p, msgs) = page(&round, "E", 1, 0);
    assert_eq!(feed.on_page(&round, &p, &msgs, |_| {}), Step::Released { count: 0, done: false });
    let round = feed.round(256);
    assert_eq!(feed.on_page(&round, &p, &msgs, |_| {}), Step::Released { count: 0, done: true });
}

#[test]
fn head_checks_find_a_silent_loss_and_leave_a_flowing_feed_alone() {
    let mut feed = Feed::new();
    feed.start(&pos("E", 1, 0));
    feed.offer(1, "E", &id("E", 1));
    assert_eq!(feed.on_head(1, "E", 1, &id("E", 1)), HeadCheck::InSync);
    assert_eq!(feed.on_head(1, "E", 1, ""), HeadCheck::InSync, "an unknown id is no difference");
    assert_eq!(feed.on_head(0, "E", 3, ""), HeadCheck::Moving, "last moved since the check began");
    assert_eq!(feed.on_head(1, "E", 3, ""), HeadCheck::Differs { gap: true, start: true });
    assert_eq!(feed.on_head(1, "E", 3, ""), HeadCheck::Differs { gap: true, start: false });
    feed.end_repair();
    assert_eq!(feed.on_head(1, "F", 0, ""), HeadCheck::Differs { gap: false, start: true });
    feed.end_repair();
    assert_eq!(feed.on_head(1, "E", 1, "other"), HeadCheck::Differs { gap: false, start: true });
}

/// What the transport does with the next message published.
#[derive(Debug, Clone, Copy)]
enum Fate {
    Deliver,
    Drop,
    Double,
    /// Held back and delivered after the next one.
    Delay,
}

fn fate() -> impl Strategy<Value = Fate> {
    prop_oneof![6 => Just(Fate::Deliver), 2 => Just(Fate::Drop), 1 => Just(Fate::Double), 1 => Just(Fate::Delay)]
}

proptest! {
    /// The sink gets every seq once, in order, whatever the transport
    /// loses, doubles or reorders, with repairs between messages and a
    /// head check at the end (the channel then goes quiet).
    #[test]
    fn the_sink_gets_every_seq_once_in_order(
        fates in proptest::collection::vec(fate(), 1..60),
        limit in 1usize..5,
        repair_every in 1usize..8,
    ) {
        let mut feed = Feed::new();
        feed.start(&pos("E", 1, 0));
        let mut sink = Vec::new();
        let mut wire: VecDeque<Seq> = VecDeque::new();
        let mut held = None;
        let mut head = 0;
        let round = |feed: &mut Feed, head: Seq, sink: &mut Vec<Seq>| {
            let r = feed.round(limit);
            let (p, msgs) = page(&r, "E", 1, head);
            match feed.on_page(&r, &p, &msgs, |m| sink.push(m.seq.unwrap())) {
                Step::Released { done: true, .. } => feed.end_repair(),
                Step::Released { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        };
        for (i, f) in fates.iter().enumerate() {
            head += 1;
            match f {
                Fate::Deliver => wire.push_back(head),
                Fate::Drop => {}
                Fate::Double => wire.extend([head, head]),
                Fate::Delay => held = Some(head),
            }
            if !matches!(f, Fate::Delay) {
                wire.extend(held.take());
            }
            while let Some(s) = wire.pop_front() {
                if feed.offer(s, "E", &id("E", s)) == Offered::Release {
                    sink.push(s);
                }
            }
            if feed.is_repairing() && i % repair_every == 0 {
                round(&mut feed, head, &mut sink);
            }
        }
        wire.extend(held.take());
        while let Some(s) = wire.pop_front() {
            if feed.offer(s, "E", &id("E", s)) == Offered::Release {
                sink.push(s);
            }
        }
        // Quiet now: the head check finds whatever is still missing.
        feed.on_head(feed.last(), "E", head, "");
        for _ in 0..200 {
            if !feed.is_repairing() {
                break;
            }
            round(&mut feed, head, &mut sink);
        }
        prop_assert!(!feed.is_repairing());
        prop_assert_eq!(sink, (1..=head).collect::<Vec<_>>());
    }
}
