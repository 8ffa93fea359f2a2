//! Fan-out between nodes: (sharded) pub/sub, made gap-free with the log.
//!
//! The append script publishes each message on `herald:{c}:fan` as it
//! commits it, so pub/sub order is seq order. A node subscribes only to the
//! channels it watches (`watch` / `unwatch`, counted in a
//! [`Watches`]: the server calls `watch` per local subscription and may
//! call `unwatch` for a subscriber that left after `watch` for one that
//! came). Pub/sub loses messages when a connection drops or a buffer
//! overflows; the log does not. Each watched channel has a [`Feed`]
//! (herald-core), which decides what to release, what is a duplicate and
//! when the log must be read; this file is the Redis side of it:
//!
//! - the pub/sub connection, its subscriptions (serialized per channel, so
//!   an unsubscribe never overtakes the subscribe of a later watch) and the
//!   payloads it carries;
//! - the repair task of a feed, at most one per channel: it reads the log
//!   from the feed's `last` (the `READ` script, not failing fast while
//!   Redis is marked down) and hands out what is missing, in order, before
//!   anything later;
//! - after a disconnection the client library reconnects and resubscribes;
//!   each resubscribe confirmation, and a periodic check of every channel
//!   that was quiet for a `head_check_interval` (the `CHECK` script:
//!   epoch, head and the id at `last`), asks the feed whether it is behind,
//!   so a message lost silently is delivered within about one interval;
//! - when the log lost what was already handed out under the same epoch (a
//!   restart without persistence, a failover that lost a tail), a new epoch
//!   (`BUMP_EPOCH`, compare-and-set, one node wins); the sink gets an epoch
//!   marker (`Message::epoch_marker`) at once, then the head message of the
//!   new epoch, so sessions holding the old epoch resync instead of
//!   skipping silently, whether the channel is busy or quiet.
//!
//! Invariants: the feed's (see `herald_core::feed`): per channel, the sink
//! gets seqs in increasing order without gap within an epoch (a range
//! removed by retention is skipped, and sessions see the jump and report
//! the truncation); every delivery and every change of the feed happens
//! under the channel's lock; at most one repair per channel. Here: every
//! queue is bounded (the push queue drops when full and then checks every
//! channel), and so is the number of repairs and checks running at once.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use herald_core::feed::{Feed, HeadCheck, Offered, Step, Watches};
use herald_core::{EngineError, Epoch, Message, QueuedLen, Seq};
use herald_proto::ChannelName;
use redis::aio::AsyncPushSender;
use redis::{ProtocolVersion, PushInfo, PushKind, Value};
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::FILL_PAGE;
use crate::conn::{is_outage, Conn, REDIAL_MIN};
use crate::dial::redial;
use crate::keys::Keys;
use crate::reply;
use crate::scripts::{BumpEpoch, Check};
use crate::state::{new_epoch, EngineState};

/// Locks serializing (un)subscribe calls per channel (striped).
const STRIPES: usize = 64;

pub(crate) struct Fanout {
    /// The watched channels, counted, each with its feed.
    feeds: Mutex<Watches<Arc<ChannelFeed>>>,
    /// Channels subscribed on the pub/sub connection.
    subscribed: Mutex<HashSet<ChannelName>>,
    stripes: Vec<tokio::sync::Mutex<()>>,
    hasher: RandomState,
    /// The pub/sub connection, replaced when it stops answering.
    pubsub: Mutex<PubSub>,
    /// Receives the pushes of every pub/sub connection made.
    push: Arc<dyn AsyncPushSender>,
    config: crate::RedisConfig,
    keys: Keys,
    permits: Semaphore,
    concurrency: usize,
    interval: Duration,
    timeout: Duration,
    /// The push queue's bytes and the pushes it dropped.
    load: Arc<PushLoad>,
    pub cancel: CancellationToken,
    pub tasks: TaskTracker,
}

struct PubSub {
    conn: Conn,
    /// Bumped at each replacement: a subscribe made on an earlier
    /// connection does not count.
    generation: u64,
    made: Instant,
}

/// One watched channel.
struct ChannelFeed {
    channel: ChannelName,
    state: Mutex<FeedState>,
}

struct FeedState {
    feed: Feed,
    /// When the channel last showed it is in sync (a message, a check).
    active_at: Instant,
    /// Check at the next tick even if recently active (after a disconnect).
    suspect: bool,
}

impl ChannelFeed {
    fn new(channel: &ChannelName) -> Self {
        let state = FeedState { feed: Feed::new(), active_at: Instant::now(), suspect: false };
        Self { channel: channel.clone(), state: Mutex::new(state) }
    }

    fn lock(&self) -> MutexGuard<'_, FeedState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What the pub/sub payload carries: `v2 <channel> <seq|-> <ts> <id>
/// <epoch|-> <closes 0|1>\n<frame>`.
struct Payload {
    seq: Option<Seq>,
    ts: u64,
    id: Arc<str>,
    epoch: String,
    /// The channel's closing message.
    closes: bool,
    frame: Bytes,
}

fn parse_payload(p: Vec<u8>) -> Option<Payload> {
    let nl = p.iter().position(|&b| b == b'\n')?;
    let header = std::str::from_utf8(&p[..nl]).ok()?;
    let mut f = header.split(' ');
    let (Some("v2"), Some(_ch), Some(seq), Some(ts), Some(id), Some(epoch), Some(closes), None) =
        (f.next(), f.next(), f.next(), f.next(), f.next(), f.next(), f.next(), f.next())
    else {
        return None;
    };
    let closes = match closes {
        "1" => true,
        "0" => false,
        _ => return None,
    };
    let seq = match reply::opt(seq) {
        Some(s) => Some(s.parse().ok()?),
        None => None,
    };
    let (ts, id, epoch) = (ts.parse().ok()?, Arc::from(id), reply::opt(epoch).unwrap_or("").to_owned());
    let frame = Bytes::from(p).slice(nl + 1..);
    Some(Payload { seq, ts, id, epoch, closes, frame })
}

impl Fanout {
    pub fn new(
        pubsub: Conn,
        push: Arc<dyn AsyncPushSender>,
        keys: Keys,
        config: &crate::RedisConfig,
        load: Arc<PushLoad>,
    ) -> Self {
        Self {
            feeds: Mutex::new(Watches::new()),
            subscribed: Mutex::new(HashSet::new()),
            stripes: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
            hasher: RandomState::new(),
            pubsub: Mutex::new(PubSub { conn: pubsub, generation: 0, made: Instant::now() }),
            push,
            config: config.clone(),
            keys,
            permits: Semaphore::new(config.fill_concurrency),
            concurrency: config.fill_concurrency,
            interval: config.head_check_interval,
            timeout: config.command_timeout,
            load,
            cancel: CancellationToken::new(),
            tasks: TaskTracker::new(),
        }
    }

    fn pubsub(&self) -> (u64, Conn) {
        let p = self.pubsub.lock().unwrap_or_else(|e| e.into_inner());
        (p.generation, p.conn.clone())
    }

    /// The pub/sub connection did not answer: replace it (at most once per
    /// `REDIAL_MIN`, single instance only; see `dial.rs`). Every channel is
    /// subscribed again by the checker, then checked against its head.
    fn redial_pubsub(&self) -> bool {
        let mut p = self.pubsub.lock().unwrap_or_else(|e| e.into_inner());
        if p.made.elapsed() < REDIAL_MIN {
            return false;
        }
        let Some(fresh) = redial(&self.config, ProtocolVersion::RESP3, Some(self.push.clone())) else {
            return false;
        };
        p.conn = fresh;
        p.generation += 1;
        p.made = Instant::now();
        self.subscribed.lock().unwrap_or_else(|e| e.into_inner()).clear();
        true
    }

    fn watches(&self) -> MutexGuard<'_, Watches<Arc<ChannelFeed>>> {
        self.feeds.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn feed(&self, ch: &ChannelName) -> Option<Arc<ChannelFeed>> {
        self.watches().get(ch).cloned()
    }

    fn all_feeds(&self) -> Vec<Arc<ChannelFeed>> {
        self.watches().states().cloned().collect()
    }

    pub fn watched(&self) -> usize {
        self.watches().len()
    }

    /// Subscribe or unsubscribe `ch` so the connection matches the watched
    /// set. Serialized per channel: an unsubscribe never overtakes the
    /// subscribe of a later watch.
    async fn reconcile(&self, ch: &ChannelName) -> Result<(), EngineError> {
        let stripe = (self.hasher.hash_one(ch.as_str()) as usize) % STRIPES;
        let _serial = self.stripes[stripe].lock().await;
        let want = self.watches().contains(ch);
        let have = self.subscribed.lock().unwrap_or_else(|e| e.into_inner()).contains(ch);
        if want == have {
            return Ok(());
        }
        let name = self.keys.fan(ch);
        let (generation, mut conn) = self.pubsub();
        let op = async {
            match (&mut conn, want) {
                (Conn::Single(c), true) => c.subscribe(&name).await,
                (Conn::Single(c), false) => c.unsubscribe(&name).await,
                (Conn::Cluster(c), true) => c.ssubscribe(&name).await,
                (Conn::Cluster(c), false) => c.sunsubscribe(&name).await,
            }
        };
        let result = match tokio::time::timeout(self.timeout, op).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(EngineError::Unavailable(format!("redis subscribe: {e}"))),
            Err(_) => {
                Err(EngineError::Unavailable(format!("redis subscribe: no answer within {:?}", self.timeout)))
            }
        };
        // Both locks, in `redial_pubsub`'s order: no replacement slips in
        // between the generation check and the update.
        let pubsub = self.pubsub.lock().unwrap_or_else(|e| e.into_inner());
        let current = pubsub.generation;
        let mut subscribed = self.subscribed.lock().unwrap_or_else(|e| e.into_inner());
        match (want, &result) {
            // On a connection replaced meanwhile it does not count: the
            // checker subscribes again on the new one.
            (true, Ok(())) if generation == current => {
                subscribed.insert(ch.clone());
            }
            (true, Ok(())) => {}
            // A failed unsubscribe may leave messages coming: they are
            // ignored (no feed), and a resubscribe after a reconnect
            // follows the library's own list.
            (false, _) => {
                subscribed.remove(ch);
            }
            (true, Err(_)) => {}
        }
        result
    }
}

/// `Log::watch`.
pub(crate) async fn watch(inner: &Arc<EngineState>, ch: &ChannelName) -> Result<(), EngineError> {
    let fan = &inner.fanout;
    let feed = fan.watches().watch(ch, || Arc::new(ChannelFeed::new(ch))).clone();
    // Subscribed before the position read: whatever commits after the read
    // comes over pub/sub.
    fan.reconcile(ch).await?;
    if !feed.lock().feed.is_started() {
        let page = inner.read_raw(ch, 0, 0, true).await?;
        if feed.lock().feed.start(&page.position) {
            spawn_repair(inner, &feed);
        }
    }
    Ok(())
}

/// `Log::unwatch`.
pub(crate) async fn unwatch(inner: &Arc<EngineState>, ch: &ChannelName) {
    let fan = &inner.fanout;
    if fan.watches().unwatch(ch).is_none() {
        // Still watched (or never was): nothing to unsubscribe.
        return;
    }
    if let Err(e) = fan.reconcile(ch).await {
        tracing::debug!(channel = %ch, error = %e, "unsubscribe failed");
    }
}

/// The push queue's bytes against its bound (its channel bounds the
/// count), and the pushes dropped since the fan-out task last looked.
pub(crate) struct PushLoad {
    bytes: QueuedLen,
    max_bytes: usize,
    dropped: AtomicU64,
}

impl PushLoad {
    pub fn new(max_bytes: usize) -> Self {
        Self { bytes: QueuedLen::new(), max_bytes, dropped: AtomicU64::new(0) }
    }

    fn drop_one(&self) {
        self.dropped.fetch_add(1, Ordering::AcqRel);
    }

    /// The pushes dropped since the last call.
    fn take_dropped(&self) -> u64 {
        self.dropped.swap(0, Ordering::AcqRel)
    }
}

/// A queued push and what it counts against the queue's bytes (its
/// channel name and payload), given back when the fan-out task is done
/// with it.
pub(crate) struct Pushed {
    info: PushInfo,
    bytes: usize,
}

impl Pushed {
    fn new(info: PushInfo) -> Self {
        let bytes = info.data.iter().map(|v| if let Value::BulkString(b) = v { b.len() } else { 0 }).sum();
        Self { info, bytes }
    }
}

/// The push sender given to the pub/sub connection: never blocks; a push
/// that does not fit the queue (its count or its bytes) is dropped and
/// counted (every channel is then checked against the log).
pub(crate) fn push_sender(
    tx: mpsc::Sender<Pushed>,
    load: Arc<PushLoad>,
) -> impl Fn(PushInfo) -> Result<(), ()> + Send + Sync + 'static {
    move |info| {
        let pushed = Pushed::new(info);
        let n = pushed.bytes;
        if !load.bytes.try_add(n, load.max_bytes) {
            load.drop_one();
            return Ok(());
        }
        if let Err(e) = tx.try_send(pushed) {
            load.bytes.sub(n);
            if let mpsc::error::TrySendError::Full(_) = e {
                load.drop_one();
            }
        }
        Ok(())
    }
}

/// Pushes taken from the queue at once.
const DISPATCH_BATCH: usize = 256;

/// The fan-out task: takes pushes in order and routes them. The pushes
/// queued at one wake are taken together, and consecutive messages of one
/// channel are offered under one hold of its feed's lock and handed to the
/// sink as one batch (each subscriber's queue gets them in one go).
pub(crate) async fn run_dispatcher(inner: Arc<EngineState>, mut rx: mpsc::Receiver<Pushed>) {
    let fan = &inner.fanout;
    let mut pushes = Vec::with_capacity(DISPATCH_BATCH);
    // The current run: one channel's messages, in push order.
    let mut run: Option<(ChannelName, Vec<Payload>)> = None;
    loop {
        let taken = tokio::select! {
            biased;
            () = fan.cancel.cancelled() => return,
            n = rx.recv_many(&mut pushes, DISPATCH_BATCH) => n,
        };
        if taken == 0 {
            return;
        }
        let dropped = fan.load.take_dropped();
        if dropped > 0 {
            inner.counters.fanout_queue_full.add(dropped);
            tracing::warn!(dropped, "fan-out queue full: pub/sub messages dropped; checking every channel");
            mark_all_suspect(&inner);
        }
        let mut bytes = 0;
        for Pushed { info: push, bytes: n } in pushes.drain(..) {
            bytes += n;
            match push.kind {
                PushKind::Message | PushKind::SMessage => {
                    let mut data = push.data.into_iter();
                    let (Some(Value::BulkString(name)), Some(Value::BulkString(payload))) =
                        (data.next(), data.next())
                    else {
                        continue;
                    };
                    let Some(ch) = fan.keys.channel_of_fan(&name) else { continue };
                    let Some(p) = parse_payload(payload) else {
                        tracing::warn!(channel = %ch, "malformed fan-out payload ignored");
                        continue;
                    };
                    match &mut run {
                        Some((current, payloads)) if *current == ch => payloads.push(p),
                        _ => {
                            if let Some((ch, payloads)) = run.take() {
                                on_messages(&inner, &ch, payloads);
                            }
                            run = Some((ch, vec![p]));
                        }
                    }
                }
                kind => {
                    // Everything else acts after the messages before it.
                    if let Some((ch, payloads)) = run.take() {
                        on_messages(&inner, &ch, payloads);
                    }
                    on_event(&inner, kind, push.data);
                }
            }
        }
        if let Some((ch, payloads)) = run.take() {
            on_messages(&inner, &ch, payloads);
        }
        fan.load.bytes.sub(bytes);
    }
}

/// A push that is not a message.
fn on_event(inner: &Arc<EngineState>, kind: PushKind, data: Vec<Value>) {
    let fan = &inner.fanout;
    match kind {
        PushKind::Disconnection => {
            inner.counters.pubsub_disconnects.bump();
            tracing::info!("pub/sub connection lost; resubscribing, then checking every watched channel");
            mark_all_suspect(inner);
        }
        PushKind::Subscribe | PushKind::SSubscribe => {
            // Also the confirmation of an automatic resubscribe after a
            // reconnect: whatever was published meanwhile is in the log.
            if let Some(ch) = data.into_iter().next().and_then(|v| match v {
                Value::BulkString(n) => fan.keys.channel_of_fan(&n),
                _ => None,
            }) {
                if let Some(feed) = fan.feed(&ch) {
                    if feed.lock().feed.recheck() {
                        spawn_repair(inner, &feed);
                    }
                }
            }
        }
        _ => {}
    }
}

fn mark_all_suspect(inner: &Arc<EngineState>) {
    for feed in inner.fanout.all_feeds() {
        feed.lock().suspect = true;
    }
}

fn deliver(inner: &EngineState, msg: Arc<Message>) {
    if let Some(sink) = inner.sink.get() {
        sink.deliver(msg);
    }
}

/// Hand the sink an epoch marker for `ch` (under the feed's lock, like
/// every delivery): sessions still on another epoch resync at once, even
/// if the channel stays quiet.
fn announce_epoch(inner: &EngineState, ch: &ChannelName, epoch: &Epoch) {
    deliver(inner, Arc::new(Message::epoch_marker(ch.clone(), epoch.clone())));
}

/// Consecutive pushed messages of one channel, in push order.
fn on_messages(inner: &Arc<EngineState>, ch: &ChannelName, payloads: Vec<Payload>) {
    let Some(feed) = inner.fanout.feed(ch) else { return };
    let mut released = Vec::with_capacity(payloads.len());
    let mut repair = false;
    // Every delivery happens under the feed's lock, so a repair cannot hand
    // out a later message first.
    let mut st = feed.lock();
    for p in payloads {
        let Some(seq) = p.seq else {
            // Volatile: live only, no order to keep.
            released.push(Arc::new(Message {
                channel: ch.clone(),
                seq: None,
                id: p.id,
                ts: p.ts,
                epoch: Epoch::new(p.epoch),
                frame: p.frame,
                closes: false,
            }));
            continue;
        };
        st.active_at = Instant::now();
        match st.feed.offer(seq, &p.epoch, &p.id) {
            Offered::Release => {
                let Some(epoch) = st.feed.epoch().cloned() else { continue };
                released.push(Arc::new(Message {
                    channel: ch.clone(),
                    seq: Some(seq),
                    id: p.id,
                    ts: p.ts,
                    epoch,
                    frame: p.frame,
                    closes: p.closes,
                }));
            }
            Offered::Skip => {}
            Offered::Repair { gap } => {
                if gap {
                    inner.counters.fanout_gaps.bump();
                }
                repair = true;
            }
        }
    }
    inner.counters.fanout_delivered.add(released.len() as u64);
    if !released.is_empty() {
        if let Some(sink) = inner.sink.get() {
            sink.deliver_batch(released);
        }
    }
    drop(st);
    if repair {
        spawn_repair(inner, &feed);
    }
}

/// Run the feed's repair, which the feed just asked for (so none runs).
fn spawn_repair(inner: &Arc<EngineState>, feed: &Arc<ChannelFeed>) {
    let (inner2, feed) = (inner.clone(), feed.clone());
    inner.fanout.tasks.spawn(async move {
        let cancel = inner2.fanout.cancel.clone();
        tokio::select! {
            () = cancel.cancelled() => {}
            () = run_repair(&inner2, &feed) => {}
        }
    });
}

/// Bring the feed up to the log: start it, fill gaps, follow an epoch
/// change, start a new epoch when Redis lost data. The feed's repair ends
/// on every path (also when the task is cancelled).
async fn run_repair(inner: &Arc<EngineState>, feed: &Arc<ChannelFeed>) {
    struct Ended<'a>(&'a ChannelFeed);
    impl Drop for Ended<'_> {
        fn drop(&mut self) {
            self.0.lock().feed.end_repair();
        }
    }
    let _ended = Ended(feed);
    let Ok(_permit) = inner.fanout.permits.acquire().await else { return };
    let ch = &feed.channel;
    // Bounded: each round either delivers, changes the epoch, or ends.
    for _round in 0..10_000 {
        let round = feed.lock().feed.round(FILL_PAGE);
        let page = match inner.read_raw(ch, round.after, round.limit, false).await {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(channel = %ch, error = %e, "fan-out read failed; the next check retries");
                return;
            }
        };
        let pos = &page.position;
        let lost = {
            let mut st = feed.lock();
            match st.feed.on_page(&round, pos, &page.messages, |m| deliver(inner, m.clone())) {
                Step::Started | Step::Stale => None,
                Step::NewEpoch { epoch, previous, lost } => {
                    inner.counters.epoch_changes.bump();
                    if lost {
                        inner.counters.data_loss_detected.bump();
                        tracing::warn!(channel = %ch, old_epoch = %previous, new_epoch = %epoch, delivered = round.last(),
                            head = pos.head, "redis lost data of a watched channel; clients resync to the new epoch");
                    } else {
                        tracing::info!(channel = %ch, old_epoch = %previous, new_epoch = %epoch, "channel epoch changed");
                    }
                    // Tell the sink now (the channel may stay quiet); the
                    // next round hands out the head message of the new epoch.
                    announce_epoch(inner, ch, &epoch);
                    None
                }
                Step::Lost { epoch, head } => Some((epoch, head)),
                Step::Released { count, done } => {
                    inner.counters.fanout_filled.add(count);
                    st.active_at = Instant::now();
                    st.suspect = false;
                    if done {
                        return;
                    }
                    None
                }
            }
        };
        let Some((epoch, head)) = lost else { continue };
        // The log lost what was handed out, under the same epoch: start a
        // new one so nobody trusts the old seqs.
        inner.counters.data_loss_detected.bump();
        let new = new_epoch();
        let args = BumpEpoch { meta: inner.keys.meta(ch), expected: epoch.as_str(), new: &new };
        let r = inner.redis.run_unchecked("bump epoch", &args).await.and_then(|r| {
            let mut r = r.fields("reply")?;
            Ok((r.int("won")?, r.string("epoch")?))
        });
        let current = match r {
            Ok((won, current)) => {
                if won == 1 {
                    tracing::warn!(channel = %ch, old_epoch = %epoch, new_epoch = %current, delivered = round.last(),
                        head, "redis lost data of a watched channel; started a new epoch (clients resync)");
                }
                current
            }
            Err(e) => {
                tracing::warn!(channel = %ch, error = %e, "could not start a new epoch; retrying at the next check");
                return;
            }
        };
        if !current.is_empty() {
            // Follow the epoch that now stands (ours or another node's) and
            // hand out its head message.
            inner.counters.epoch_changes.bump();
            let current = Epoch::new(current);
            let mut st = feed.lock();
            st.feed.follow(current.clone(), head);
            announce_epoch(inner, ch, &current);
        }
    }
    tracing::warn!(channel = %ch, "fan-out repair stopped after its round limit; the next check resumes");
}

/// The periodic loop: keep the pub/sub connection alive, retry what
/// failed, and check every channel quiet for an interval.
pub(crate) async fn run_checker(inner: Arc<EngineState>) {
    let fan = &inner.fanout;
    let mut tick = tokio::time::interval(fan.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            () = fan.cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        // A PING makes a pub/sub connection whose reconnect round gave up
        // start another (it is allowed in subscribed mode under RESP3); one
        // that does not answer is replaced. The command connections are
        // probed at the same time.
        let ping = async {
            let (_, mut conn) = fan.pubsub();
            let r =
                tokio::time::timeout(fan.timeout, redis::cmd("PING").query_async::<Value>(&mut conn)).await;
            let answered = match &r {
                Ok(Ok(_)) => true,
                Ok(Err(e)) => !is_outage(e),
                Err(_) => false,
            };
            if !answered && fan.redial_pubsub() {
                tracing::debug!("pub/sub connection replaced");
                mark_all_suspect(&inner);
            }
        };
        tokio::join!(ping, inner.redis.probe());
        if inner.redis.health.down_reason().is_some() {
            // Checks would only wait for their timeouts; they run (all of
            // them) once Redis answers again.
            mark_all_suspect(&inner);
            continue;
        }
        let now = Instant::now();
        let feeds = fan.all_feeds();
        let checks = feeds.into_iter().map(|feed| {
            let inner = inner.clone();
            async move {
                let subscribed =
                    fan.subscribed.lock().unwrap_or_else(|e| e.into_inner()).contains(&feed.channel);
                if !subscribed && fan.reconcile(&feed.channel).await.is_err() {
                    return;
                }
                let last = {
                    let mut st = feed.lock();
                    if st.feed.is_repairing() {
                        return;
                    }
                    if !st.feed.is_started() {
                        if st.feed.request_repair() {
                            spawn_repair(&inner, &feed);
                        }
                        return;
                    }
                    if !st.suspect && now.duration_since(st.active_at) < fan.interval {
                        return;
                    }
                    st.feed.last()
                };
                check(&inner, &feed, last).await;
            }
        });
        let checks = futures_util::stream::iter(checks);
        futures_util::StreamExt::for_each_concurrent(checks, fan.concurrency, |f| f).await;
    }
}

/// Compare the channel in Redis with the feed (which was at `last`); start
/// the repair if they differ.
async fn check(inner: &Arc<EngineState>, feed: &Arc<ChannelFeed>, last: Seq) {
    let ch = &feed.channel;
    let args = Check { meta: inner.keys.meta(ch), log: inner.keys.log(ch), seq: last };
    let r = inner.redis.run_unchecked("check", &args).await.and_then(|r| {
        let mut r = r.fields("reply")?;
        Ok((r.string("epoch")?, r.int("head")?, r.string("id")?))
    });
    let Ok((epoch, head, id)) = r else { return };
    let mut st = feed.lock();
    match st.feed.on_head(last, &epoch, head, &id) {
        HeadCheck::Moving => {}
        HeadCheck::InSync => {
            st.active_at = Instant::now();
            st.suspect = false;
        }
        HeadCheck::Differs { gap, start } => {
            if gap {
                inner.counters.fanout_gaps.bump();
            }
            if start {
                spawn_repair(inner, feed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pushed message of `payload` bytes on a 14-byte channel name.
    fn message(payload: usize) -> PushInfo {
        PushInfo {
            kind: PushKind::Message,
            data: vec![Value::BulkString(b"herald:{c}:fan".to_vec()), Value::BulkString(vec![b'x'; payload])],
        }
    }

    /// Take everything queued, giving its bytes back as the fan-out task does.
    fn take_all(rx: &mut mpsc::Receiver<Pushed>, load: &PushLoad) {
        while let Ok(p) = rx.try_recv() {
            load.bytes.sub(p.bytes);
        }
    }

    #[test]
    fn the_push_queue_drops_what_exceeds_its_bytes_or_its_count() {
        let (tx, mut rx) = mpsc::channel(4);
        let load = Arc::new(PushLoad::new(1_000));
        let send = push_sender(tx, load.clone());
        // 314 bytes each: three fit in 1,000, the fourth does not.
        for _ in 0..4 {
            send(message(300)).unwrap();
        }
        assert_eq!((rx.len(), load.take_dropped(), load.bytes.get()), (3, 1, 942));
        assert_eq!(load.take_dropped(), 0, "counted once");
        // What the fan-out task took and gave back makes room again.
        let taken = rx.try_recv().unwrap();
        load.bytes.sub(taken.bytes);
        send(message(300)).unwrap();
        assert_eq!((rx.len(), load.take_dropped()), (3, 0));
        // The count: small pushes fill the channel's four slots; the one
        // refused by the channel leaves no bytes behind.
        take_all(&mut rx, &load);
        for _ in 0..5 {
            send(message(10)).unwrap();
        }
        assert_eq!((rx.len(), load.take_dropped(), load.bytes.get()), (4, 1, 4 * 24));
        take_all(&mut rx, &load);
        // A push above the bytes bound goes into an empty queue only.
        send(message(5_000)).unwrap();
        send(message(10)).unwrap();
        assert_eq!((rx.len(), load.take_dropped()), (1, 1));
    }
}
