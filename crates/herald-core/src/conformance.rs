//! Engine conformance scenarios, shared by every engine's tests.
//!
//! Each scenario takes a [`Fixture`] (a fresh engine with a recording
//! [`FanoutSink`] installed) and panics on a violation of the [`Engine`]
//! contract. Channel names and dedup keys carry a per-fixture prefix, so the
//! scenarios may share one backing store (one Redis) with other runs.
//!
//! An engine's tests either call [`run_all`] with a factory, or generate
//! one test per scenario from the one list, `with_conformance_scenarios!`
//! (see `herald-store/tests/conformance.rs`), so none can be forgotten.
//!
//! Time-dependent scenarios (lease expiry) use short real TTLs
//! ([`SHORT_TTL`]) and poll with a deadline; the engine's own clock decides.
//! `presence_expire` is global by contract (it sweeps every channel), so the
//! expiry scenarios need the engine's expiry index to be private to the
//! fixture (a fresh store, or a per-fixture key prefix): another run's
//! concurrent sweeps on the same index would take their leases.
//!
//! The module also holds the one bounded wait every test in the workspace
//! uses, [`eventually`] and [`assert_eventually`] under the deadline
//! [`WAIT`]: the lowest crate every test depends on, so the engines' tests
//! and the server harness (`herald-test-support`) share it.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::BoxFuture;
use herald_proto::{ChannelName, Member, MessageView, Meta};
use serde_json::value::RawValue;

use crate::engine::{
    AckError, AppendRequest, Dedup, Engine, EngineError, FanoutSink, Message, Retention, Seq, SubscriberId,
};
use crate::room::Room;

mod control;
mod presence;
mod rooms;
mod schedules;

pub use control::{
    bans_and_revocations_keep_the_later_time, broadcasts_reach_the_sink_and_node_entries_are_leased,
};
pub use presence::{
    presence_expire_returns_each_expired_lease_once, presence_join_lists_counts_and_finds_users,
    presence_rejoin_is_fenced_by_later_tokens_and_leaves, presence_rejoin_reclaims_with_a_greater_token,
    presence_renew_never_resurrects_a_swept_lease, presence_stale_tokens_have_no_effect,
    presence_tokens_stay_monotonic_without_leases,
};
pub use rooms::{
    closing_a_room_closes_its_channel, room_cas_admits_one_writer_per_version,
    room_create_conflicts_with_an_existing_room, room_versions_are_logged_in_order_with_messages, room_write,
};
pub use schedules::{
    a_later_claim_fences_off_an_earlier_one, cancelled_schedules_are_never_delivered,
    delivered_schedules_are_fanned_out_with_their_frames, schedule_dedup_returns_the_original_receipt,
    schedules_are_claimed_in_order_and_delivered_once,
};

/// How long a scenario waits for fan-out before it fails.
const FANOUT_DEADLINE: Duration = Duration::from_secs(10);
/// A lease TTL that no scenario outlives.
pub const LONG_TTL: Duration = Duration::from_secs(300);
/// A lease TTL that scenarios wait out.
pub const SHORT_TTL: Duration = Duration::from_millis(300);
/// How long a scenario waits for leases to expire and be swept.
const EXPIRY_DEADLINE: Duration = Duration::from_secs(10);
/// How far an engine's clock (Redis `TIME`) may be from the test's.
const CLOCK_SLACK_MS: u64 = 5_000;

/// Upper bound for any single wait in a test: generous, so a loaded CI
/// machine does not fail a test that only waits for something to happen.
pub const WAIT: Duration = Duration::from_secs(20);

/// Poll `check` every 10 ms until it returns `Some`; panics after [`WAIT`].
/// The one bounded wait of every test in the workspace (real-time waits
/// poll with a deadline instead of sleeping a fixed time).
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "not within {WAIT:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Poll `check` until it holds; panics after [`WAIT`].
pub async fn assert_eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually(what, || {
        let holds = check();
        async move { holds.await.then_some(()) }
    })
    .await
}

/// A [`FanoutSink`] that keeps everything it is given, in delivery order.
#[derive(Default)]
pub struct RecordingSink {
    delivered: Mutex<Vec<Arc<Message>>>,
}

impl FanoutSink for RecordingSink {
    fn deliver(&self, msg: Arc<Message>) {
        self.delivered.lock().unwrap_or_else(|e| e.into_inner()).push(msg);
    }
}

impl RecordingSink {
    /// Everything delivered so far, in order.
    pub fn delivered(&self) -> Vec<Arc<Message>> {
        self.delivered.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// What was delivered for `channel`, in order.
    pub fn delivered_on(&self, channel: &ChannelName) -> Vec<Arc<Message>> {
        self.delivered().into_iter().filter(|m| &m.channel == channel).collect()
    }

    /// Wait until `channel` has had at least `n` deliveries; panics after
    /// [`FANOUT_DEADLINE`].
    pub async fn wait_for(&self, channel: &ChannelName, n: usize) -> Vec<Arc<Message>> {
        let deadline = tokio::time::Instant::now() + FANOUT_DEADLINE;
        loop {
            let got = self.delivered_on(channel);
            if got.len() >= n {
                return got;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "fan-out on {channel}: {} of {n} messages after {FANOUT_DEADLINE:?}",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A fresh engine under test, its recording sink and a name prefix.
pub struct Fixture {
    pub engine: Arc<dyn Engine>,
    pub sink: Arc<RecordingSink>,
    prefix: String,
}

impl Fixture {
    /// Wrap a freshly made engine and install the recording sink (before any
    /// append, as the contract asks).
    pub fn new(engine: Arc<dyn Engine>) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let sink = Arc::new(RecordingSink::default());
        engine.set_sink(sink.clone());
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let prefix = format!("conf{nanos}n{}", NEXT.fetch_add(1, Ordering::Relaxed));
        Self { engine, sink, prefix }
    }

    /// A channel name unique to this fixture.
    pub fn channel(&self, name: &str) -> ChannelName {
        ChannelName::new(&format!("{}:{name}", self.prefix)).expect("scenario channel names are valid")
    }

    /// A dedup spec with a key unique to this fixture; `fingerprint` stands
    /// for the request's hash.
    pub fn dedup(&self, key: &str, fingerprint: u8) -> Dedup {
        Dedup {
            key: Arc::from(format!("{}/{key}", self.prefix)),
            fingerprint: [fingerprint; 32],
            ttl: Duration::from_secs(3600),
        }
    }

    /// A user id unique to this fixture (users, like channels, may be shared
    /// with other runs on one backing store).
    pub fn user(&self, name: &str) -> String {
        format!("{}-{name}", self.prefix)
    }

    /// The subscriber `(self.user(user), device)`.
    pub fn subscriber(&self, user: &str, device: Option<&str>) -> SubscriberId {
        SubscriberId::new(self.user(user), device.map(Arc::from)).expect("scenario subscribers are valid")
    }

    /// A presence member: user `self.user(user)`, no device, no info.
    pub fn member(&self, user: &str, client_id: &str) -> Member {
        Member { client_id: client_id.to_owned(), user: self.user(user), device: None, info: None }
    }

    /// The active rooms of this fixture (`rooms_active`, paged from just
    /// before the fixture's channels to just after).
    pub async fn active_rooms(&self) -> Vec<(ChannelName, Room)> {
        let own = format!("{}:", self.prefix);
        // Every channel of this fixture sorts after this name, and they are
        // contiguous in name order.
        let mut after = ChannelName::new(&own).expect("the prefix is a valid channel name");
        let mut out = Vec::new();
        loop {
            let page = self.engine.rooms_active(Some(&after), 7).await.expect("rooms_active");
            let Some((last, _)) = page.last() else { return out };
            let more = page.len() == 7;
            after = last.clone();
            let before = out.len();
            out.extend(page.into_iter().filter(|(c, _)| c.as_str().starts_with(&own)));
            if !more || out.len() - before < 7 {
                return out;
            }
        }
    }

    /// Append `n` messages to `channel`.
    pub async fn fill(&self, channel: &ChannelName, n: u64) {
        for i in 0..n {
            self.engine.append(request(channel, &i.to_string())).await.expect("append");
        }
    }

    /// `watch` the channel (needed for fan-out by engines that subscribe per
    /// channel, like Redis).
    pub async fn watch(&self, channel: &ChannelName) {
        self.engine.watch(channel).await.expect("watch");
    }
}

/// A durable append of `data` (JSON) with no retention and no dedup.
pub fn request(channel: &ChannelName, data: &str) -> AppendRequest {
    AppendRequest::message(
        channel.clone(),
        RawValue::from_string(data.to_owned()).expect("scenario data is valid JSON"),
        true,
        Retention { max_len: 0, max_age: None },
    )
}

fn seqs(messages: &[Arc<Message>]) -> Vec<u64> {
    messages.iter().map(|m| m.seq.expect("durable messages have a seq")).collect()
}

/// Seqs start at 1 and are gap-free per channel, independently across
/// channels; a channel never written is at head 0, first 1.
pub async fn seqs_are_gap_free_per_channel(fx: &Fixture) {
    let (a, b) = (fx.channel("a"), fx.channel("b"));
    let empty = fx.engine.position(&a).await.expect("position");
    assert_eq!((empty.head, empty.first), (0, 1), "a channel never written");
    assert!(fx.engine.read(&a, 0, 10).await.expect("read").messages.is_empty());

    let mut ids = HashSet::new();
    for i in 1..=5u64 {
        let r = fx.engine.append(request(&a, &format!("{{\"n\":{i}}}"))).await.expect("append a");
        assert_eq!((r.seq, r.duplicate, &r.channel), (Some(i), false, &a));
        assert!(ids.insert(r.id.clone()), "ids are unique");
        assert_eq!(r.epoch, empty.epoch, "one epoch per channel log");
        if i <= 3 {
            let r = fx.engine.append(request(&b, "true")).await.expect("append b");
            assert_eq!(r.seq, Some(i), "channels count independently");
            assert!(ids.insert(r.id.clone()), "ids are unique across channels");
        }
    }
    let pa = fx.engine.position(&a).await.expect("position a");
    let pb = fx.engine.position(&b).await.expect("position b");
    assert_eq!((pa.head, pa.first), (5, 1));
    assert_eq!((pb.head, pb.first), (3, 1));
}

/// 200 concurrent appends to one channel get the seqs 1..=200, each once, and
/// `read` returns them in order with the ids that were returned.
pub async fn concurrent_appends_get_each_seq_once(fx: &Fixture) {
    const N: u64 = 200;
    let ch = fx.channel("busy");
    let tasks: Vec<_> = (0..N)
        .map(|i| {
            let (engine, ch) = (fx.engine.clone(), ch.clone());
            tokio::spawn(async move { engine.append(request(&ch, &i.to_string())).await })
        })
        .collect();
    let mut receipts = Vec::new();
    for t in futures_util::future::join_all(tasks).await {
        receipts.push(t.expect("task").expect("append"));
    }
    receipts.sort_by_key(|r| r.seq);
    assert_eq!(receipts.iter().map(|r| r.seq.unwrap_or(0)).collect::<Vec<_>>(), (1..=N).collect::<Vec<_>>());

    let page = fx.engine.read(&ch, 0, 1000).await.expect("read");
    assert_eq!(seqs(&page.messages), (1..=N).collect::<Vec<_>>());
    for (m, r) in page.messages.iter().zip(&receipts) {
        assert_eq!((&m.id, m.ts), (&r.id, r.ts), "read returns what the append reported");
    }
    assert_eq!(page.position.head, N);
}

/// Same key and fingerprint: the original receipt, `duplicate: true`, and
/// nothing appended.
pub async fn duplicate_append_returns_original_receipt(fx: &Fixture) {
    let ch = fx.channel("dedup");
    let with_key = || AppendRequest { dedup: Some(fx.dedup("k1", 1)), ..request(&ch, "{\"x\":1}") };
    let first = fx.engine.append(with_key()).await.expect("first");
    assert!(!first.duplicate);
    let again = fx.engine.append(with_key()).await.expect("retry");
    assert!(again.duplicate, "a retry is reported as a duplicate");
    assert_eq!(
        (&again.channel, again.seq, &again.id, again.ts, &again.epoch),
        (&first.channel, first.seq, &first.id, first.ts, &first.epoch),
        "a retry gets the original receipt"
    );
    assert_eq!(fx.engine.position(&ch).await.expect("position").head, 1, "a retry appends nothing");
    let next = fx.engine.append(request(&ch, "2")).await.expect("next");
    assert_eq!(next.seq, Some(2));
}

/// Same key, different fingerprint: `IdempotencyMismatch`, nothing appended.
pub async fn reused_key_with_other_request_is_mismatch(fx: &Fixture) {
    let ch = fx.channel("mismatch");
    let first = AppendRequest { dedup: Some(fx.dedup("k", 1)), ..request(&ch, "1") };
    fx.engine.append(first).await.expect("first");
    let other = AppendRequest { dedup: Some(fx.dedup("k", 2)), ..request(&ch, "2") };
    assert_eq!(fx.engine.append(other).await, Err(EngineError::IdempotencyMismatch));
    assert_eq!(fx.engine.position(&ch).await.expect("position").head, 1);
}

/// 50 concurrent appends with one key append once; all get that receipt,
/// and it is fanned out once.
pub async fn concurrent_duplicates_append_once(fx: &Fixture) {
    let ch = fx.channel("race");
    fx.watch(&ch).await;
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (engine, ch, dedup) = (fx.engine.clone(), ch.clone(), fx.dedup("same", 9));
            tokio::spawn(async move {
                engine.append(AppendRequest { dedup: Some(dedup), ..request(&ch, "\"once\"") }).await
            })
        })
        .collect();
    let receipts: Vec<_> = futures_util::future::join_all(tasks)
        .await
        .into_iter()
        .map(|t| t.expect("task").expect("append"))
        .collect();
    assert_eq!(receipts.iter().filter(|r| !r.duplicate).count(), 1, "exactly one original");
    for r in &receipts {
        assert_eq!(
            (r.seq, &r.id, r.ts),
            (Some(1), &receipts[0].id, receipts[0].ts),
            "all receipts are equal"
        );
    }
    assert_eq!(fx.engine.position(&ch).await.expect("position").head, 1);
    // A later append on the channel is delivered after the original: once
    // it is seen, a duplicate fan-out would have been seen too.
    fx.engine.append(request(&ch, "\"marker\"")).await.expect("marker");
    let got = fx.sink.wait_for(&ch, 2).await;
    assert_eq!(seqs(&got), vec![1, 2], "the original is fanned out once, duplicates never");
}

/// One `append_batch` over several channels, with a key used twice on its
/// channel (a duplicate), reused on another channel and with another
/// fingerprint (mismatches), a volatile message and a closing append: each request
/// is answered as if appended alone, in batch order; each channel's
/// messages get their seqs, their fan-out and their place in the log in
/// batch order; a retry of the whole batch appends nothing.
pub async fn append_batch_keeps_order_and_dedup(fx: &Fixture) {
    let (a, b, c) = (fx.channel("ba"), fx.channel("bb"), fx.channel("bc"));
    for ch in [&a, &b, &c] {
        fx.watch(ch).await;
    }
    let keyed = |ch: &ChannelName, data: &str, key: &str, fp: u8| AppendRequest {
        dedup: Some(fx.dedup(key, fp)),
        ..request(ch, data)
    };
    let batch = || {
        vec![
            keyed(&a, "\"a1\"", "k1", 1),                              // 0: a seq 1
            request(&b, "\"b1\""),                                     // 1: b seq 1
            request(&a, "\"a2\""),                                     // 2: a seq 2
            keyed(&a, "\"a1\"", "k1", 1),                              // 3: duplicate of 0
            keyed(&b, "\"b?\"", "k1", 4),                              // 4: k1 is a's (another request)
            keyed(&a, "\"a3\"", "k2", 2),                              // 5: a seq 3
            keyed(&a, "\"other\"", "k2", 7),                           // 6: mismatch
            AppendRequest { durable: false, ..request(&b, "\"v\"") },  // 7: volatile
            AppendRequest { closes: true, ..request(&c, "\"last\"") }, // 8: c seq 1, closes it
            request(&c, "\"late\""),                                   // 9: closed
            keyed(&b, "\"b2\"", "k3", 3),                              // 10: b seq 2
        ]
    };
    let results = fx.engine.append_batch(batch()).await;
    assert_eq!(results.len(), 11, "one result per request");
    let ok = |i: usize| results[i].clone().unwrap_or_else(|e| panic!("request {i}: {e:?}"));
    let expect = [
        (0, &a, Some(1)),
        (1, &b, Some(1)),
        (2, &a, Some(2)),
        (5, &a, Some(3)),
        (8, &c, Some(1)),
        (10, &b, Some(2)),
    ];
    for (i, ch, seq) in expect {
        let r = ok(i);
        assert_eq!((&r.channel, r.seq, r.duplicate), (ch, seq, false), "request {i}");
    }
    let dup = ok(3);
    assert!(dup.duplicate, "a key used twice in one batch: the second is a duplicate");
    assert_eq!((dup.seq, &dup.id, dup.ts), (Some(1), &ok(0).id, ok(0).ts), "with the original receipt");
    assert_eq!(results[4], Err(EngineError::IdempotencyMismatch), "a key is its first channel's");
    assert_eq!(results[6], Err(EngineError::IdempotencyMismatch), "another fingerprint");
    assert_eq!((ok(7).seq, ok(7).duplicate), (None, false), "volatile: no seq");
    assert_eq!(results[9], Err(EngineError::Closed), "after the close in the same batch");

    let data = |ms: &[Arc<Message>]| -> Vec<String> {
        ms.iter()
            .map(|m| {
                MessageView::parse(&m.frame)
                    .expect("frame")
                    .data
                    .map(|d| d.get().to_owned())
                    .unwrap_or_default()
            })
            .collect()
    };
    let log_a = fx.engine.read(&a, 0, 100).await.expect("read a").messages;
    assert_eq!(seqs(&log_a), vec![1, 2, 3]);
    assert_eq!(data(&log_a), vec!["\"a1\"", "\"a2\"", "\"a3\""], "a's log in batch order");
    let log_b = fx.engine.read(&b, 0, 100).await.expect("read b").messages;
    assert_eq!(data(&log_b), vec!["\"b1\"", "\"b2\""], "b's log: the volatile message is not stored");
    let pos_c = fx.engine.position(&c).await.expect("position c");
    assert_eq!((pos_c.head, pos_c.closed), (1, true));

    let fan_a = fx.sink.wait_for(&a, 3).await;
    assert_eq!(
        (seqs(&fan_a), data(&fan_a)),
        (vec![1, 2, 3], data(&log_a)),
        "a's fan-out in seq order, once each"
    );
    let fan_b = fx.sink.wait_for(&b, 3).await;
    let durable_b: Vec<_> = fan_b.iter().filter_map(|m| m.seq).collect();
    assert_eq!(durable_b, vec![1, 2], "b's durable fan-out in seq order");
    assert_eq!(fan_b.iter().filter(|m| m.seq.is_none()).count(), 1, "the volatile message once");
    let fan_c = fx.sink.wait_for(&c, 1).await;
    assert!(fan_c[0].closes, "the closing append is fanned out as the channel's last message");

    // The same batch again: every keyed request is a duplicate of the
    // first run's, nothing new is appended.
    let again = fx.engine.append_batch(batch()).await;
    for i in [0, 3, 5, 10] {
        let r = again[i].clone().unwrap_or_else(|e| panic!("retry {i}: {e:?}"));
        assert!(r.duplicate, "retry {i} is a duplicate");
        assert_eq!(r.seq, ok(if i == 3 { 0 } else { i }).seq, "retry {i} gets the original seq");
    }
    assert_eq!(again[4], Err(EngineError::IdempotencyMismatch));
    assert_eq!(again[6], Err(EngineError::IdempotencyMismatch));
    assert_eq!(again[8], Err(EngineError::Closed));
    assert_eq!(again[9], Err(EngineError::Closed));
    assert_eq!(fx.engine.position(&a).await.expect("position a").head, 4, "only the unkeyed a2 again");
    assert_eq!(fx.engine.position(&b).await.expect("position b").head, 3, "only the unkeyed b1 again");
    // Nothing of the retry is fanned out but the new messages, after the
    // first run's.
    let fan_a = fx.sink.wait_for(&a, 4).await;
    assert_eq!(seqs(&fan_a), vec![1, 2, 3, 4]);
}

/// `read(after, limit)` pages through the log; past the head it is empty.
pub async fn read_pages_by_after_and_limit(fx: &Fixture) {
    let ch = fx.channel("pages");
    for i in 1..=10 {
        fx.engine.append(request(&ch, &i.to_string())).await.expect("append");
    }
    let read = |after, limit| {
        let (engine, ch) = (fx.engine.clone(), ch.clone());
        async move { engine.read(&ch, after, limit).await.expect("read") }
    };
    assert_eq!(seqs(&read(0, 3).await.messages), vec![1, 2, 3]);
    assert_eq!(seqs(&read(3, 3).await.messages), vec![4, 5, 6]);
    assert_eq!(seqs(&read(6, 100).await.messages), vec![7, 8, 9, 10]);
    assert_eq!(seqs(&read(9, 1).await.messages), vec![10]);
    let past = read(10, 5).await;
    assert!(past.messages.is_empty());
    assert_eq!((past.position.head, past.position.first), (10, 1));
    assert!(read(50, 5).await.messages.is_empty(), "after beyond head");
    assert!(read(0, 0).await.messages.is_empty(), "limit 0");
}

/// `max_len` trims the oldest messages, advances `first`, and a read after
/// a trimmed seq starts at `first`.
pub async fn max_len_trims_oldest(fx: &Fixture) {
    const MAX_LEN: u64 = 5;
    let ch = fx.channel("trim");
    for i in 1..=12 {
        let req = AppendRequest {
            retention: Retention { max_len: MAX_LEN, max_age: None },
            ..request(&ch, &i.to_string())
        };
        fx.engine.append(req).await.expect("append");
    }
    let pos = fx.engine.position(&ch).await.expect("position");
    assert_eq!(pos.head, 12);
    // "At most max_len": an engine may keep fewer, never more.
    let oldest_kept = pos.head - MAX_LEN + 1;
    assert!((oldest_kept..=pos.head).contains(&pos.first), "first = {}", pos.first);
    let all = fx.engine.read(&ch, 0, 100).await.expect("read");
    assert_eq!(seqs(&all.messages), (pos.first..=12).collect::<Vec<_>>());
    assert_eq!(all.position.first, pos.first);
    let from_trimmed = fx.engine.read(&ch, 2, 2).await.expect("read");
    assert_eq!(seqs(&from_trimmed.messages), vec![pos.first, pos.first + 1], "starts at first");
}

/// Every append is fanned out once, per channel in seq order; duplicates are
/// not fanned out.
pub async fn fanout_delivers_each_append_once_in_seq_order(fx: &Fixture) {
    const N: u64 = 30;
    let channels = [fx.channel("f1"), fx.channel("f2")];
    for ch in &channels {
        fx.watch(ch).await;
    }
    let mut tasks = Vec::new();
    for i in 0..N {
        for ch in &channels {
            let (engine, ch, dedup) = (fx.engine.clone(), ch.clone(), fx.dedup(&format!("{ch}/{i}"), 3));
            tasks.push(tokio::spawn(async move {
                let req = || AppendRequest { dedup: Some(dedup.clone()), ..request(&ch, &i.to_string()) };
                let first = engine.append(req()).await.expect("append");
                let retry = engine.append(req()).await.expect("retry");
                assert!(retry.duplicate);
                first
            }));
        }
    }
    for t in futures_util::future::join_all(tasks).await {
        t.expect("task");
    }
    for ch in &channels {
        let marker = fx.engine.append(request(ch, "\"marker\"")).await.expect("marker");
        assert_eq!(marker.seq, Some(N + 1));
        let got = fx.sink.wait_for(ch, (N + 1) as usize).await;
        assert_eq!(seqs(&got), (1..=N + 1).collect::<Vec<_>>(), "{ch}: once each, in seq order");
        for m in &got {
            let view = MessageView::parse(&m.frame).expect("frame is JSON");
            assert_eq!(
                (view.kind.as_str(), view.channel.as_deref(), view.seq),
                ("message", Some(ch.as_str()), m.seq)
            );
        }
    }
}

/// Volatile appends get no seq, are fanned out, and are not stored; a
/// deduped volatile retry is not fanned out again.
pub async fn volatile_appends_are_fanned_out_not_stored(fx: &Fixture) {
    let ch = fx.channel("typing");
    fx.watch(&ch).await;
    let volatile = |data: &str| AppendRequest { durable: false, ..request(&ch, data) };
    let plain = fx.engine.append(volatile("1")).await.expect("volatile");
    assert_eq!((plain.seq, plain.duplicate), (None, false));
    let keyed = || AppendRequest { dedup: Some(fx.dedup("v", 4)), ..volatile("2") };
    let first = fx.engine.append(keyed()).await.expect("keyed");
    let retry = fx.engine.append(keyed()).await.expect("retry");
    assert!(retry.duplicate && retry.seq.is_none());
    assert_eq!((&retry.id, retry.ts), (&first.id, first.ts));
    let marker = fx.engine.append(volatile("3")).await.expect("marker");

    let got = fx.sink.wait_for(&ch, 3).await;
    let ids: Vec<_> = got.iter().map(|m| m.id.clone()).collect();
    assert_eq!(ids, vec![plain.id, first.id, marker.id], "each volatile message once, retry not");
    assert!(got.iter().all(|m| m.seq.is_none()));
    let view = MessageView::parse(&got[0].frame).expect("frame");
    assert_eq!((view.kind.as_str(), view.seq), ("message", None));

    let pos = fx.engine.position(&ch).await.expect("position");
    assert_eq!((pos.head, pos.first), (0, 1), "volatile messages are not stored");
    assert!(fx.engine.read(&ch, 0, 10).await.expect("read").messages.is_empty());
}

/// The stored frame is the fanned-out frame: data byte for byte, meta, and
/// the receipt's seq, id and ts.
pub async fn stored_frames_are_the_fanned_out_frames(fx: &Fixture) {
    let ch = fx.channel("frames");
    fx.watch(&ch).await;
    let data = r#"{"text": "hé \"quoted\"", "n": [1, 2.50]}"#;
    let mut meta = Meta::new();
    meta.insert("trace_id".into(), "t-1".into());
    let receipt =
        fx.engine.append(AppendRequest { meta: Some(meta), ..request(&ch, data) }).await.expect("append");
    let live = fx.sink.wait_for(&ch, 1).await.remove(0);
    let stored = fx.engine.read(&ch, 0, 1).await.expect("read").messages.remove(0);
    assert_eq!(live.frame, stored.frame, "one encoding, stored and sent");
    for m in [&live, &stored] {
        assert_eq!((m.seq, &m.id, m.ts, &m.epoch), (receipt.seq, &receipt.id, receipt.ts, &receipt.epoch));
    }
    let view = MessageView::parse(&stored.frame).expect("frame");
    assert_eq!(view.kind, "message");
    assert_eq!(view.channel.as_deref(), Some(ch.as_str()));
    assert_eq!((view.seq, view.id.as_deref(), view.ts), (receipt.seq, Some(&*receipt.id), Some(receipt.ts)));
    assert_eq!(view.data.expect("data").get(), data, "data is kept byte for byte");
    assert_eq!(view.meta.expect("meta")["trace_id"], "t-1");
}

/// After `close`, appends and acks fail with `ShuttingDown`.
pub async fn appends_after_close_are_refused(fx: &Fixture) {
    let ch = fx.channel("closed");
    let sub = fx.subscriber("closer", None);
    fx.engine.append(request(&ch, "1")).await.expect("append before close");
    fx.engine.close().await;
    assert_eq!(fx.engine.append(request(&ch, "2")).await, Err(EngineError::ShuttingDown));
    assert_eq!(fx.engine.ack(&ch, &sub, 1).await, Err(AckError::Engine(EngineError::ShuttingDown)));
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

async fn cursor_of(fx: &Fixture, ch: &ChannelName, sub: &SubscriberId) -> Option<Seq> {
    fx.engine.cursor(ch, sub).await.expect("cursor").map(|c| c.seq)
}

/// Acks are cumulative and never go backwards: ack 5 then ack 3 leaves 5; a
/// repeated ack changes nothing (not even the ack time); an ack beyond the
/// head is refused and stores nothing.
pub async fn ack_is_cumulative_and_monotonic(fx: &Fixture) {
    let ch = fx.channel("acks");
    let sub = fx.subscriber("mono", Some("phone"));
    fx.fill(&ch, 10).await;

    let before = now_ms();
    let five = fx.engine.ack(&ch, &sub, 5).await.expect("ack 5");
    let after = now_ms();
    assert_eq!(five.seq, 5);
    // Server clocks may differ by a little between nodes (Redis `TIME`).
    assert!(
        five.acked_at_ms + 5_000 >= before && five.acked_at_ms <= after + 5_000,
        "acked_at_ms {} is the time of the ack ({before}..={after})",
        five.acked_at_ms
    );
    assert_eq!(fx.engine.cursor(&ch, &sub).await.expect("cursor"), Some(five));

    assert_eq!(fx.engine.ack(&ch, &sub, 3).await.expect("ack 3"), five, "a lower ack returns the cursor");
    assert_eq!(fx.engine.ack(&ch, &sub, 5).await.expect("ack 5 again"), five, "idempotent");
    assert_eq!(fx.engine.cursor(&ch, &sub).await.expect("cursor"), Some(five), "never backwards");

    assert_eq!(
        fx.engine.ack(&ch, &sub, 11).await,
        Err(AckError::BeyondHead { seq: 11, head: 10 }),
        "an ack beyond the head is refused"
    );
    assert_eq!(cursor_of(fx, &ch, &sub).await, Some(5), "a refused ack stores nothing");

    let ten = fx.engine.ack(&ch, &sub, 10).await.expect("ack head");
    assert_eq!(ten.seq, 10);
    assert!(ten.acked_at_ms >= five.acked_at_ms);
    assert_eq!(cursor_of(fx, &ch, &sub).await, Some(10));
}

/// No cursor before the first ack, on a written channel and on one never
/// written; `ack 0` creates a cursor at 0; any other ack on an empty
/// channel is beyond its head.
pub async fn cursor_is_absent_before_any_ack(fx: &Fixture) {
    let (written, empty) = (fx.channel("written"), fx.channel("never"));
    let sub = fx.subscriber("fresh", None);
    fx.fill(&written, 3).await;
    assert_eq!(fx.engine.cursor(&written, &sub).await.expect("cursor"), None);
    assert_eq!(fx.engine.cursor(&empty, &sub).await.expect("cursor"), None);
    assert!(fx.engine.cursors(&written, 10).await.expect("cursors").is_empty());
    assert!(fx.engine.user_cursors(sub.user(), 10).await.expect("user cursors").is_empty());

    assert_eq!(fx.engine.ack(&empty, &sub, 1).await, Err(AckError::BeyondHead { seq: 1, head: 0 }));
    assert_eq!(fx.engine.cursor(&empty, &sub).await.expect("cursor"), None, "nothing stored");
    let zero = fx.engine.ack(&empty, &sub, 0).await.expect("ack 0");
    assert_eq!(zero.seq, 0);
    assert_eq!(fx.engine.cursor(&empty, &sub).await.expect("cursor"), Some(zero));
    assert_eq!(fx.engine.cursor(&written, &sub).await.expect("cursor"), None, "per channel");
}

/// Each device of a user, and the user without a device, has its own
/// cursor; other users' cursors are separate too.
pub async fn cursors_are_per_device(fx: &Fixture) {
    let ch = fx.channel("devices");
    fx.fill(&ch, 10).await;
    let (a, b, bare) =
        (fx.subscriber("u", Some("a")), fx.subscriber("u", Some("b")), fx.subscriber("u", None));
    let other = fx.subscriber("v", Some("a"));
    fx.engine.ack(&ch, &a, 3).await.expect("ack a");
    fx.engine.ack(&ch, &b, 7).await.expect("ack b");
    assert_eq!(cursor_of(fx, &ch, &a).await, Some(3), "b's ack does not move a");
    assert_eq!(cursor_of(fx, &ch, &b).await, Some(7));
    assert_eq!(cursor_of(fx, &ch, &bare).await, None, "no device is a subscriber of its own");
    assert_eq!(cursor_of(fx, &ch, &other).await, None, "same device id, other user");
    fx.engine.ack(&ch, &bare, 9).await.expect("ack bare");
    fx.engine.ack(&ch, &a, 4).await.expect("ack a again");
    assert_eq!(
        (cursor_of(fx, &ch, &a).await, cursor_of(fx, &ch, &b).await, cursor_of(fx, &ch, &bare).await),
        (Some(4), Some(7), Some(9))
    );
}

/// `cursors(channel)` lists every subscriber of that channel once, with its
/// cursor, and nothing of other channels; `limit` bounds it.
pub async fn cursors_lists_each_subscriber(fx: &Fixture) {
    let (ch, other) = (fx.channel("receipts"), fx.channel("receipts2"));
    fx.fill(&ch, 10).await;
    fx.fill(&other, 10).await;
    let subs = [
        (fx.subscriber("r1", None), 2),
        (fx.subscriber("r1", Some("tablet")), 4),
        (fx.subscriber("r2", Some("phone")), 10),
        (fx.subscriber("r3:x", None), 0),
    ];
    for (sub, seq) in &subs {
        fx.engine.ack(&ch, sub, *seq).await.expect("ack");
    }
    fx.engine.ack(&other, &fx.subscriber("r9", None), 1).await.expect("ack other channel");

    let mut listed = fx.engine.cursors(&ch, 100).await.expect("cursors");
    listed.sort_by(|x, y| x.0.cmp(&y.0));
    let mut expected: Vec<(SubscriberId, Seq)> = subs.to_vec();
    expected.sort_by(|x, y| x.0.cmp(&y.0));
    let got: Vec<(SubscriberId, Seq)> = listed.iter().map(|(s, c)| (s.clone(), c.seq)).collect();
    assert_eq!(got, expected, "every subscriber of the channel once");
    for (sub, state) in &listed {
        assert_eq!(fx.engine.cursor(&ch, sub).await.expect("cursor"), Some(*state), "{sub:?}: same state");
    }
    let two = fx.engine.cursors(&ch, 2).await.expect("cursors");
    assert_eq!(two.len(), 2, "limit bounds the list");
    assert!(fx.engine.cursors(&ch, 0).await.expect("cursors").is_empty());
}

/// `user_cursors(user)` lists exactly that user's cursors: every channel and
/// device, none of another user, even one whose name extends or contains
/// the user's.
pub async fn user_cursors_lists_the_users_channels_only(fx: &Fixture) {
    let (c1, c2, c3) = (fx.channel("inbox1"), fx.channel("inbox2"), fx.channel("inbox3"));
    for ch in [&c1, &c2, &c3] {
        fx.fill(ch, 5).await;
    }
    let user = fx.user("amy");
    let mine = [
        (&c1, fx.subscriber("amy", Some("a")), 1),
        (&c1, fx.subscriber("amy", Some("b")), 2),
        (&c2, fx.subscriber("amy", None), 3),
    ];
    for (ch, sub, seq) in &mine {
        fx.engine.ack(ch, sub, *seq).await.expect("ack");
    }
    // Near misses: a longer name, names that run into the device id when
    // user and device are simply concatenated, the same device elsewhere.
    let near_misses = [
        fx.subscriber("amy1", None),
        fx.subscriber("amyb", Some("a")),
        fx.subscriber("am", Some("y")),
        fx.subscriber("amy/a", None),
        fx.subscriber("zed", Some("a")),
    ];
    for sub in &near_misses {
        fx.engine.ack(&c1, sub, 4).await.expect("ack near miss");
        fx.engine.ack(&c3, sub, 4).await.expect("ack near miss");
    }

    let mut got: Vec<(String, Option<String>, Seq)> = fx
        .engine
        .user_cursors(&user, 100)
        .await
        .expect("user cursors")
        .into_iter()
        .map(|u| (u.channel.to_string(), u.device.map(|d| d.to_string()), u.cursor.seq))
        .collect();
    got.sort();
    let mut expected: Vec<(String, Option<String>, Seq)> =
        mine.iter().map(|(ch, sub, seq)| (ch.to_string(), sub.device().map(str::to_owned), *seq)).collect();
    expected.sort();
    assert_eq!(got, expected, "the user's cursors, nobody else's");
    assert_eq!(fx.engine.user_cursors(&user, 2).await.expect("user cursors").len(), 2, "limit");
    assert!(fx.engine.user_cursors(&fx.user("nobody"), 10).await.expect("user cursors").is_empty());
    assert!(fx.engine.user_cursors("", 10).await.expect("invalid user").is_empty());
}

/// Many tasks acking one cursor concurrently, in any order, leave it at the
/// highest seq acked; every ack returns a cursor at least as high as its
/// own seq. Several subscribers do so at once without disturbing each
/// other.
pub async fn concurrent_acks_end_at_the_max(fx: &Fixture) {
    const N: u64 = 100;
    const SUBSCRIBERS: u64 = 4;
    let ch = fx.channel("race-acks");
    fx.fill(&ch, N).await;
    let mut tasks = Vec::new();
    for s in 0..SUBSCRIBERS {
        let sub = fx.subscriber("racer", Some(&format!("d{s}")));
        let top = N - s; // each subscriber tops out at its own max
        for i in 0..top {
            // A scattered order: 37 is coprime with every `top` used here.
            let seq = (i * 37) % top + 1;
            let (engine, ch, sub) = (fx.engine.clone(), ch.clone(), sub.clone());
            tasks.push(tokio::spawn(async move {
                let state = engine.ack(&ch, &sub, seq).await.expect("ack");
                assert!(state.seq >= seq, "ack {seq} returned cursor {}", state.seq);
            }));
        }
    }
    for t in futures_util::future::join_all(tasks).await {
        t.expect("task");
    }
    for s in 0..SUBSCRIBERS {
        let sub = fx.subscriber("racer", Some(&format!("d{s}")));
        assert_eq!(cursor_of(fx, &ch, &sub).await, Some(N - s), "{sub:?} ends at its max");
    }
    let listed = fx.engine.cursors(&ch, 100).await.expect("cursors");
    assert_eq!(listed.len() as u64, SUBSCRIBERS);
}

/// Ownership leases: one holder at a time, a renewal keeps the token, every
/// take-over (after expiry or a release) gets a greater one. A one-node
/// engine answers `Local` to every claim and passes trivially.
pub async fn ownership_is_exclusive_and_fenced(fx: &Fixture) {
    use crate::engine::Owned;
    let key = format!("{}/work", fx.prefix);
    let a = fx.engine.claim(&key, "node-a", LONG_TTL).await.expect("claim");
    if a == Owned::Local {
        assert_eq!(fx.engine.claim(&key, "node-b", LONG_TTL).await.expect("claim"), Owned::Local);
        return;
    }
    let Owned::Held(t1) = a else { panic!("a free lease is taken: {a:?}") };
    assert_eq!(fx.engine.claim(&key, "node-a", LONG_TTL).await.expect("renew"), Owned::Held(t1), "renewal");
    assert_eq!(fx.engine.claim(&key, "node-b", LONG_TTL).await.expect("claim"), Owned::Busy, "exclusive");
    // Another holder's release changes nothing.
    fx.engine.release(&key, "node-b").await.expect("release");
    assert_eq!(fx.engine.claim(&key, "node-b", LONG_TTL).await.expect("claim"), Owned::Busy);
    fx.engine.release(&key, "node-a").await.expect("release");
    let Owned::Held(t2) = fx.engine.claim(&key, "node-b", SHORT_TTL).await.expect("claim") else {
        panic!("a released lease is free")
    };
    assert!(t2 > t1, "a take-over gets a greater token: {t1} then {t2}");
    // Expiry frees it too, with a greater token again.
    let deadline = tokio::time::Instant::now() + EXPIRY_DEADLINE;
    let t3 = loop {
        if let Owned::Held(t) = fx.engine.claim(&key, "node-a", LONG_TTL).await.expect("claim") {
            break Some(t);
        }
        assert!(tokio::time::Instant::now() < deadline, "the lease did not expire");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(t3.expect("taken") > t2, "greater after expiry too");
}

/// Calls `$callback![name, name, ...]` with the name of every scenario, in
/// order: the one list of scenarios. An engine's tests generate one test per
/// scenario from it (see `herald-store/tests/conformance.rs`), so a new
/// scenario cannot be forgotten by any engine.
#[macro_export]
macro_rules! with_conformance_scenarios {
    ($callback:ident) => {
        $callback![
            seqs_are_gap_free_per_channel,
            concurrent_appends_get_each_seq_once,
            duplicate_append_returns_original_receipt,
            reused_key_with_other_request_is_mismatch,
            concurrent_duplicates_append_once,
            append_batch_keeps_order_and_dedup,
            read_pages_by_after_and_limit,
            max_len_trims_oldest,
            fanout_delivers_each_append_once_in_seq_order,
            volatile_appends_are_fanned_out_not_stored,
            stored_frames_are_the_fanned_out_frames,
            appends_after_close_are_refused,
            ack_is_cumulative_and_monotonic,
            cursor_is_absent_before_any_ack,
            cursors_are_per_device,
            cursors_lists_each_subscriber,
            user_cursors_lists_the_users_channels_only,
            concurrent_acks_end_at_the_max,
            presence_join_lists_counts_and_finds_users,
            presence_rejoin_reclaims_with_a_greater_token,
            presence_stale_tokens_have_no_effect,
            presence_renew_never_resurrects_a_swept_lease,
            presence_expire_returns_each_expired_lease_once,
            presence_tokens_stay_monotonic_without_leases,
            presence_rejoin_is_fenced_by_later_tokens_and_leaves,
            room_create_conflicts_with_an_existing_room,
            room_cas_admits_one_writer_per_version,
            room_versions_are_logged_in_order_with_messages,
            closing_a_room_closes_its_channel,
            schedules_are_claimed_in_order_and_delivered_once,
            schedule_dedup_returns_the_original_receipt,
            cancelled_schedules_are_never_delivered,
            a_later_claim_fences_off_an_earlier_one,
            delivered_schedules_are_fanned_out_with_their_frames,
            ownership_is_exclusive_and_fenced,
            bans_and_revocations_keep_the_later_time,
            broadcasts_reach_the_sink_and_node_entries_are_leased,
        ];
    };
}

/// One scenario, type-erased so [`run_all`] can hold them in a list.
pub type Scenario = for<'a> fn(&'a Fixture) -> BoxFuture<'a, ()>;

macro_rules! scenario_list {
    ($($name:ident),* $(,)?) => {
        /// Every scenario with its name, in the order [`run_all`] runs them.
        pub fn scenarios() -> Vec<(&'static str, Scenario)> {
            vec![$((stringify!($name), {
                fn erased(fx: &Fixture) -> BoxFuture<'_, ()> {
                    Box::pin($name(fx))
                }
                erased as Scenario
            })),*]
        }
    };
}

crate::with_conformance_scenarios!(scenario_list);

/// Run every scenario, each on a fresh engine from `make`, closing it after.
/// Panics (naming the scenario on stderr first) at the first violation.
pub async fn run_all<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Engine>>,
{
    for (name, scenario) in scenarios() {
        eprintln!("engine conformance: {name}");
        let fx = Fixture::new(make().await);
        scenario(&fx).await;
        fx.engine.close().await;
    }
}
