use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::namespace::StartAt;
use herald_proto::Since;

/// Timers as a map from key to (seq, due), with a clock the test moves.
#[derive(Default)]
struct FakeTimers {
    now: Duration,
    next_key: u64,
    live: BTreeMap<u64, (Seq, Duration)>,
}

impl Timers for FakeTimers {
    type Key = u64;
    fn set(&mut self, seq: Seq, after: Duration) -> u64 {
        self.next_key += 1;
        self.live.insert(self.next_key, (seq, self.now + after));
        self.next_key
    }
    fn cancel(&mut self, key: u64) {
        assert!(self.live.remove(&key).is_some(), "cancelled a key that is not live");
    }
}

impl FakeTimers {
    /// Fire the earliest timer: its key is spent.
    fn fire(&mut self) -> Option<Seq> {
        let (&key, &(seq, due)) = self.live.iter().min_by_key(|(k, (_, due))| (*due, **k))?;
        self.live.remove(&key);
        self.now = self.now.max(due);
        Some(seq)
    }
}

fn pos(epoch: &str, first: Seq, head: Seq) -> Position {
    Position { epoch: Epoch::new(epoch), first, head, closed: false }
}

fn since(seq: Seq, epoch: Option<&str>) -> Since {
    Since { seq, epoch: epoch.map(str::to_owned) }
}

fn opts(max_inflight: u32, max_attempts: u32) -> AckOpts {
    AckOpts {
        timeout: Duration::from_secs(1),
        backoff_max: Duration::from_secs(10),
        max_attempts,
        max_inflight,
    }
}

#[test]
fn durable_starts_after_since_or_at_head() {
    let p = pos("E", 5, 20);
    let s = resolve(&p, None, None).unwrap();
    assert_eq!((s.next, s.truncated, s.epoch_changed, s.unread()), (21, false, false, 0));
    let s = resolve(&p, Some(&since(10, Some("E"))), None).unwrap();
    assert_eq!((s.next, s.unread()), (11, 10));
    // An empty epoch is "unknown": the seq is trusted.
    assert_eq!(resolve(&p, Some(&since(10, Some(""))), None).unwrap().next, 11);
    assert_eq!(resolve(&p, Some(&since(20, None)), None).unwrap().next, 21);
}

#[test]
fn durable_since_older_than_retention_is_truncated_and_another_epoch_restarts() {
    let p = pos("E", 5, 20);
    let s = resolve(&p, Some(&since(2, Some("E"))), None).unwrap();
    assert_eq!((s.next, s.truncated, s.skipped), (5, true, 2));
    // since.seq 4 means "has 4": nothing lost.
    let s = resolve(&p, Some(&since(4, None)), None).unwrap();
    assert_eq!((s.next, s.truncated), (5, false));
    let s = resolve(&p, Some(&since(50, Some("OLD"))), None).unwrap();
    assert_eq!((s.next, s.truncated, s.epoch_changed), (5, false, true));
    assert_eq!(resolve(&p, Some(&since(21, Some("E"))), None), Err(BeyondHead { since: 21, head: 20 }));
}

#[test]
fn acked_starts_after_the_larger_of_cursor_and_since() {
    let p = pos("E", 1, 30);
    let a = |stored, start| Some(AckedStart { stored, start });
    assert_eq!(resolve(&p, Some(&since(7, None)), a(Some(12), StartAt::Head)).unwrap().next, 13);
    let s = resolve(&p, Some(&since(17, None)), a(Some(12), StartAt::Head)).unwrap();
    assert_eq!((s.next, s.stored), (18, 12));
    // Another epoch: the stored cursor belongs to this log.
    let s = resolve(&p, Some(&since(25, Some("OLD"))), a(Some(12), StartAt::Head)).unwrap();
    assert_eq!((s.next, s.epoch_changed), (13, true));
    // No cursor, no since: the namespace's start.
    assert_eq!(resolve(&p, None, a(None, StartAt::Head)).unwrap().next, 31);
    assert_eq!(resolve(&p, None, a(None, StartAt::Oldest)).unwrap().next, 1);
    // A cursor behind retention: truncated, counted.
    let s = resolve(&pos("E", 10, 30), None, a(Some(3), StartAt::Head)).unwrap();
    assert_eq!((s.next, s.truncated, s.skipped, s.stored), (10, true, 6, 3));
}

#[test]
fn live_messages_are_taken_in_order_and_a_gap_or_new_epoch_goes_back_to_the_log() {
    let mut t = FakeTimers::default();
    let start = resolve(&pos("E", 1, 3), Some(&since(3, None)), None).unwrap();
    let mut s = Subscription::<u64>::start(&start, None);
    let e = Epoch::new("E");
    assert!(!s.wants_read());
    assert_eq!(s.on_live(4, &e, &mut t), Live::Send);
    assert_eq!(s.on_live(4, &e, &mut t), Live::Skip, "duplicate");
    assert_eq!(s.on_live(6, &e, &mut t), Live::Read, "gap");
    assert_eq!(s.on_live(5, &e, &mut t), Live::Skip, "reading: the read includes it");
    let read = s.read(256).unwrap();
    assert_eq!(read, Read { after: 4, limit: 256 });
    assert_eq!(s.on_page(read, &pos("E", 1, 6), [5, 6], &mut t), Paged::Send { more: false });
    assert_eq!(s.next(), 7);
    assert_eq!(s.on_live(7, &e, &mut t), Live::Send);
    // Another epoch, even with a seq already passed.
    assert_eq!(s.on_live(2, &Epoch::new("F"), &mut t), Live::Read);
    let read = s.read(256).unwrap();
    assert_eq!(s.on_page(read, &pos("F", 1, 2), [1, 2], &mut t), Paged::Resync);
}

#[test]
fn a_page_that_starts_past_next_means_resync() {
    let mut t = FakeTimers::default();
    let start = resolve(&pos("E", 1, 10), Some(&since(2, None)), None).unwrap();
    let mut s = Subscription::<u64>::start(&start, None);
    let read = s.read(4).unwrap();
    assert_eq!(read.after, 2);
    // Trimmed meanwhile: the oldest retained is 6.
    assert_eq!(s.on_page(read, &pos("E", 6, 10), [6, 7, 8, 9], &mut t), Paged::Resync);
    assert_eq!(s.on_page(read, &pos("E", 6, 10), [], &mut t), Paged::Resync);
    // A hole inside a page is lost data too.
    let mut s = Subscription::<u64>::start(&start, None);
    assert_eq!(s.on_page(read, &pos("E", 1, 10), [3, 5], &mut t), Paged::Resync);
    // A read that no longer matches (the subscription moved on) sends nothing.
    let mut s = Subscription::<u64>::start(&start, None);
    assert_eq!(s.on_page(read, &pos("E", 1, 10), [3, 4, 5, 6], &mut t), Paged::Send { more: true });
    assert_eq!(s.on_page(read, &pos("E", 1, 10), [3, 4, 5, 6], &mut t), Paged::Ignore { more: true });
    assert_eq!(s.next(), 7);
}

#[test]
fn full_pages_keep_reading_and_a_short_one_goes_live() {
    let mut t = FakeTimers::default();
    let start = resolve(&pos("E", 1, 5), Some(&since(0, None)), None).unwrap();
    let mut s = Subscription::<u64>::start(&start, None);
    let read = s.read(3).unwrap();
    assert_eq!(s.on_page(read, &pos("E", 1, 5), [1, 2, 3], &mut t), Paged::Send { more: true });
    let read = s.read(3).unwrap();
    assert_eq!(s.on_page(read, &pos("E", 1, 5), [4, 5], &mut t), Paged::Send { more: false });
    assert_eq!(s.read(3), None);
    assert_eq!(s.on_live(6, &Epoch::new("E"), &mut t), Live::Send);
}

#[test]
fn acked_window_pauses_and_an_ack_reopens_it() {
    let mut t = FakeTimers::default();
    let p = pos("E", 1, 0);
    let start = resolve(&p, None, Some(AckedStart { stored: None, start: StartAt::Head })).unwrap();
    let mut s = Subscription::start(&start, Some(opts(2, 5)));
    let e = Epoch::new("E");
    assert_eq!(s.on_live(1, &e, &mut t), Live::Send);
    assert_eq!(s.on_live(2, &e, &mut t), Live::Send);
    assert_eq!(s.on_live(3, &e, &mut t), Live::Skip, "window full");
    assert!(!s.wants_read(), "paused, not reading");
    assert_eq!(t.live.len(), 2);
    assert_eq!(s.check_ack(3), Err(AckRefused::NotDelivered { next: 3 }));
    assert_eq!(s.check_ack(1), Ok(AckStep::Store { seq: 1 }));
    assert!(s.on_acked(1, 1, &mut t), "the window opened: read");
    assert_eq!(t.live.len(), 1);
    assert_eq!(s.check_ack(1), Ok(AckStep::Stored), "idempotent");
    let read = s.read(256).unwrap();
    assert_eq!(read, Read { after: 2, limit: 1 });
    assert_eq!(s.on_page(read, &pos("E", 1, 3), [3], &mut t), Paged::Send { more: false });
    let durable = Subscription::<u64>::start(&start, None);
    assert_eq!(durable.check_ack(1), Err(AckRefused::NotAcked));
}

#[test]
fn timers_redeliver_with_backoff_then_stale_drops_every_timer() {
    let mut t = FakeTimers::default();
    let start =
        resolve(&pos("E", 1, 0), None, Some(AckedStart { stored: None, start: StartAt::Head })).unwrap();
    let mut s = Subscription::start(&start, Some(opts(8, 3)));
    let e = Epoch::new("E");
    s.on_live(1, &e, &mut t);
    s.on_live(2, &e, &mut t);
    let mut seen = Vec::new();
    while let Some(seq) = t.fire() {
        let x = s.on_timer(seq, &mut t);
        seen.push((seq, t.now, x));
        if x == Expiry::Stale {
            break;
        }
    }
    assert_eq!(seen[0], (1, Duration::from_secs(1), Expiry::Redeliver { attempt: 2 }));
    let third = seen.iter().find(|x| x.2 == Expiry::Redeliver { attempt: 3 }).unwrap();
    let waited = third.1.as_secs_f64() - 1.0;
    assert!((1.6..=2.4).contains(&waited), "doubled with jitter: {waited}");
    assert_eq!(seen.last().unwrap().2, Expiry::Stale);
    assert!(s.is_stale() && t.live.is_empty(), "stale: no timer left");
    assert_eq!(s.on_live(3, &e, &mut t), Live::Skip);
    assert_eq!(s.on_timer(1, &mut t), Expiry::Ignore);
}

#[test]
fn backoff_is_capped() {
    let o = opts(1, 10);
    for _ in 0..100 {
        let d = backoff(&o, 9).as_secs_f64();
        assert!((8.0..=12.0).contains(&d), "{d}");
    }
}

/// One step of the model: what the world does next.
#[derive(Debug, Clone)]
enum Step {
    /// A publish: appended to the log; its live copy reaches the outbox,
    /// or is lost (a lost pub/sub message), or arrives twice.
    Append { live: u8 },
    /// The next outbox message reaches the session.
    Deliver,
    /// The session serves one queued read.
    Serve,
    /// The client acks everything it has.
    Ack,
    /// The earliest redelivery timer fires.
    Fire,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0u8..10).prop_map(|live| Step::Append { live }),
        3 => Just(Step::Deliver),
        2 => Just(Step::Serve),
        1 => Just(Step::Ack),
        1 => Just(Step::Fire),
    ]
}

/// Drive a subscription against a model log and outbox; return the first
/// deliveries the client got, in order.
fn run(
    steps: &[Step],
    since_seq: Seq,
    preloaded: Seq,
    acked: Option<AckOpts>,
    page: usize,
) -> (Vec<Seq>, Seq) {
    let e = Epoch::new("E");
    let mut head = preloaded;
    let mut t = FakeTimers::default();
    let mut outbox: VecDeque<Seq> = VecDeque::new();
    let start = resolve(
        &pos("E", 1, head),
        Some(&since(since_seq.min(head), None)),
        acked.map(|_| AckedStart { stored: None, start: StartAt::Head }),
    )
    .unwrap();
    let mut s = Subscription::start(&start, acked);
    let mut got = Vec::new();
    let mut queued = s.wants_read();
    let mut max_unacked = 0usize;
    let serve_read = |s: &mut Subscription<u64>, t: &mut FakeTimers, got: &mut Vec<Seq>, head: Seq| {
        let Some(read) = s.read(page) else { return false };
        let seqs: Vec<Seq> = (read.after + 1..=head).take(read.limit).collect();
        match s.on_page(read, &pos("E", 1, head), seqs.iter().copied(), t) {
            Paged::Send { more } => {
                got.extend(&seqs);
                more
            }
            Paged::Resync | Paged::Ignore { .. } => panic!("no reset or trim in this model"),
        }
    };
    // After the steps, the engine's head check (or the next publish)
    // hands the head to the hub again: a lost tail does not stay lost.
    let n = steps.len();
    for (i, st) in steps.iter().cloned().chain(std::iter::repeat_n(Step::Deliver, 64)).enumerate() {
        if i == n && head > 0 {
            outbox.push_back(head);
        }
        match st {
            Step::Append { live } => {
                head += 1;
                match live {
                    0 => {}
                    1 => outbox.extend([head, head]),
                    _ => outbox.push_back(head),
                }
            }
            Step::Deliver => {
                if let Some(seq) = outbox.pop_front() {
                    match s.on_live(seq, &e, &mut t) {
                        Live::Send => got.push(seq),
                        Live::Skip => {}
                        Live::Read => queued = true,
                    }
                }
            }
            Step::Serve => {
                if queued {
                    queued = serve_read(&mut s, &mut t, &mut got, head);
                }
            }
            Step::Ack => {
                if let Some(&last) = got.last() {
                    if let Ok(AckStep::Store { seq }) = s.check_ack(last) {
                        queued |= s.on_acked(seq, seq, &mut t);
                    }
                }
            }
            Step::Fire => {
                if let Some(seq) = t.fire() {
                    if let Expiry::Redeliver { .. } = s.on_timer(seq, &mut t) {
                        assert!(got.contains(&seq), "only delivered seqs are redelivered");
                    }
                }
            }
        }
        if acked.is_some() {
            max_unacked = max_unacked.max(t.live.len());
        }
    }
    if let Some(o) = acked {
        assert!(max_unacked <= o.max_inflight as usize, "window: {max_unacked} > {}", o.max_inflight);
    }
    // Quiesce: ack everything and serve reads until nothing is left, as a
    // live client that keeps acking would.
    for _ in 0..10_000 {
        if let Some(&last) = got.last() {
            if let Ok(AckStep::Store { seq }) = s.check_ack(last) {
                queued |= s.on_acked(seq, seq, &mut t);
            }
        }
        if !queued && !s.wants_read() {
            break;
        }
        queued = serve_read(&mut s, &mut t, &mut got, head);
    }
    (got, head)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever the live feed loses, doubles or delays, the client gets
    /// every seq after its start exactly once, in order, with no gap.
    #[test]
    fn durable_delivery_is_complete_in_order_and_once(
        steps in prop::collection::vec(step(), 0..200),
        preloaded in 0u64..20,
        since_seq in 0u64..20,
        page in 1usize..6,
    ) {
        let (got, head) = run(&steps, since_seq, preloaded, None, page);
        let from = since_seq.min(preloaded) + 1;
        prop_assert_eq!(got, (from..=head).collect::<Vec<_>>());
    }

    /// The same for acked delivery, with a small window and timers firing:
    /// first deliveries stay complete and ordered and the window holds.
    #[test]
    fn acked_delivery_is_complete_in_order_and_once_within_the_window(
        steps in prop::collection::vec(step(), 0..200),
        preloaded in 0u64..20,
        since_seq in 0u64..20,
        page in 1usize..6,
        inflight in 1u32..5,
    ) {
        let (got, head) = run(&steps, since_seq, preloaded, Some(opts(inflight, 1000)), page);
        let from = since_seq.min(preloaded) + 1;
        prop_assert_eq!(got, (from..=head).collect::<Vec<_>>());
    }
}
