//! The hub: which local connections subscribe to which channel, and the
//! engine's fan-out sink.
//!
//! Invariants:
//! - fan-out never awaits: each subscriber gets a `try_send` of the shared
//!   [`Outgoing`] (the message encoded once); a message a connection cannot
//!   take applies the channel's policy (durable: kick the connection as a
//!   slow consumer, it resumes from the log; volatile: drop for that
//!   connection and count);
//! - a connection takes a message only while its outbox holds fewer than
//!   `limits.outbox_capacity` frames and, unless it holds nothing, at most
//!   `limits.outbox_bytes` bytes ([`ConnBytes`]);
//! - the bytes queued server-wide ([`QueuedBytes`]: each frame once, however
//!   many outboxes share it) never exceed `limits.total_outbox_bytes`: every
//!   charge is a compare-and-swap against the ceiling, released when the
//!   last holder lets go. A message that would cross it is queued for no one
//!   ([`Outgoing::missed`]), and the connections holding the most are
//!   kicked until the total is back under three quarters of the ceiling
//!   ([`Hub::shed`]);
//! - the hub holds only small handles (id, bounded sender, byte count, kick
//!   token); the session task owns everything else and removes its entries
//!   on every exit path (see `session::Registrations`).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::task::{ArcWake, AtomicWaker};
use herald_core::{FanoutSink, Message};
use herald_proto::ChannelName;
use prometheus_client::metrics::gauge::Gauge;

use crate::config::Limits;
use crate::metrics::Metrics;

const SHARDS: usize = 32;
/// Least time between two sheds: kicked connections need a moment to let
/// go of what they hold.
const SHED_INTERVAL: Duration = Duration::from_millis(100);

/// What the hub knows about one connection.
#[derive(Clone)]
pub struct ConnHandle {
    pub id: u64,
    /// Bytes queued for this connection: its outbox, plus what its session
    /// holds in its write path; the outbox itself; and its slow-consumer
    /// kick (see [`ConnBytes`]).
    pub bytes: Arc<ConnBytes>,
}

/// Why a session must end now (see [`ConnBytes::poll_stop`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The server is shutting down ([`Sessions::stop_all`]).
    Shutdown,
    /// The connection fell too far behind ([`ConnBytes::kick`]).
    SlowConsumer,
}

/// Bits of [`ConnBytes::stop`].
const STOP_SLOW: u8 = 1;
const STOP_SHUTDOWN: u8 = 2;

/// One message on its way to this node's subscribers, shared by their
/// outboxes. Holds its frame's bytes against the server's ceiling until the
/// last outbox or write batch lets go of it.
pub struct Outgoing {
    pub msg: Arc<Message>,
    /// The server was at its ceiling: queued for no one. Carries the
    /// message without its frame; a durable subscriber that was keeping up
    /// reads it from the log instead (see `session::accept_live`).
    pub missed: bool,
    /// The frame as a Centrifugo push, made by the first Centrifugo
    /// subscriber that sends it and shared by the others (`None` inside: a
    /// frame that does not read). Not counted in the byte bounds: about
    /// the frame's size, and only while the message is queued.
    pub centrifugo: std::sync::OnceLock<Option<Bytes>>,
    _charge: Option<Charge>,
}

/// Bytes of frames queued for delivery on this server, each frame counted
/// once: in outboxes, in the batches sessions are writing, in the catch-up
/// pages they hold. The count is the `herald_outbox_bytes` gauge itself.
pub struct QueuedBytes {
    gauge: Gauge,
    ceiling: i64,
}

impl QueuedBytes {
    pub fn new(gauge: Gauge, ceiling: usize) -> Self {
        Self { gauge, ceiling: i64::try_from(ceiling).unwrap_or(i64::MAX) }
    }

    /// Charge `len` bytes if the total stays within the ceiling.
    pub fn try_charge(self: &Arc<Self>, len: usize) -> Option<Charge> {
        let n = i64::try_from(len).ok()?;
        self.gauge
            .inner()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| (t + n <= self.ceiling).then_some(t + n))
            .ok()?;
        Some(Charge { queued: self.clone(), len: n })
    }

    /// Bytes that can still be charged (a snapshot).
    pub fn room(&self) -> usize {
        usize::try_from(self.ceiling - self.gauge.get()).unwrap_or(0)
    }

    /// Bytes charged (a snapshot).
    pub fn total(&self) -> usize {
        usize::try_from(self.gauge.get()).unwrap_or(0)
    }
}

/// Bytes held against the server's ceiling; released on drop.
pub struct Charge {
    queued: Arc<QueuedBytes>,
    len: i64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.queued.gauge.dec_by(self.len);
    }
}

/// One connection's outbox and the bytes queued for it: frames in its
/// outbox (each counted in full even when shared with other connections:
/// this is how far behind it is), plus the batch or catch-up page its
/// session is writing. The hub adds, the session subtracts what it wrote.
///
/// The outbox is a bounded queue the hub pushes to without waiting and the
/// session drains: one allocation per connection for all of it (a channel
/// crate's shared state and the hook it allocates for each wait of the
/// receiver cost an idle connection ~280 bytes). Its queue allocates on
/// the first message.
///
/// It is also how the session learns it must stop (a slow-consumer
/// [`kick`](ConnBytes::kick), shutdown): one atomic the session reads each time it is
/// polled, and the same waker as the outbox, so a session's loop takes no
/// lock shared with other connections (a `CancellationToken` or `Notify`
/// polled by every session takes the one mutex behind it on each poll).
///
/// And it is the waker the session hands its socket's read side
/// ([`ArcWake`]): a wake from the socket is recorded, so the session polls
/// the socket only after it signalled (`session/read_gate.rs`), at no
/// allocation of its own.
pub struct ConnBytes {
    queued: AtomicUsize,
    /// `STOP_*` bits: why the session must end, once set never cleared.
    stop: AtomicU8,
    /// The socket's read side woke the session since the session last
    /// polled it, or its last poll yielded a frame (`session/read_gate.rs`).
    read_signalled: AtomicBool,
    /// Messages not yet taken by the session, at most `capacity`; `None`
    /// once the session ended (nothing is queued any more).
    outbox: Mutex<Option<VecDeque<Arc<Outgoing>>>>,
    capacity: usize,
    /// The session's task, waiting for the outbox or a stop.
    waiting: AtomicWaker,
}

/// Why [`ConnBytes::push`] did not queue a message.
#[derive(Debug, PartialEq, Eq)]
pub enum PushError {
    /// The outbox holds `limits.outbox_capacity` messages.
    Full,
    /// The session ended.
    Closed,
}

/// The waker of the socket's read side (`session/read_gate.rs`).
impl ArcWake for ConnBytes {
    fn wake_by_ref(arc_self: &Arc<Self>) {
        arc_self.signal_read();
        arc_self.waiting.wake();
    }
}

impl ConnBytes {
    /// A connection whose outbox holds at most `capacity` messages.
    pub fn new(capacity: usize) -> Self {
        Self {
            queued: AtomicUsize::new(0),
            stop: AtomicU8::new(0),
            // The first poll of the read side goes through.
            read_signalled: AtomicBool::new(true),
            outbox: Mutex::new(Some(VecDeque::new())),
            capacity,
            waiting: AtomicWaker::new(),
        }
    }

    /// Queue a message for the session and wake it.
    pub fn push(&self, out: Arc<Outgoing>) -> Result<(), PushError> {
        {
            let mut outbox = self.outbox.lock().expect("outbox lock poisoned");
            let queue = outbox.as_mut().ok_or(PushError::Closed)?;
            if queue.len() >= self.capacity {
                return Err(PushError::Full);
            }
            queue.push_back(out);
        }
        self.waiting.wake();
        Ok(())
    }

    /// The read side may have something: the next poll goes to the socket.
    pub fn signal_read(&self) {
        self.read_signalled.store(true, Ordering::Release);
    }

    /// Whether the read side signalled since the last call; clears the
    /// signal, so a wake from here on sets it again.
    pub fn take_read_signal(&self) -> bool {
        self.read_signalled.swap(false, Ordering::AcqRel)
    }

    /// The next queued message, if any.
    pub fn pop(&self) -> Option<Arc<Outgoing>> {
        self.outbox.lock().expect("outbox lock poisoned").as_mut()?.pop_front()
    }

    /// Messages queued now.
    pub fn outbox_len(&self) -> usize {
        self.outbox.lock().expect("outbox lock poisoned").as_ref().map_or(0, VecDeque::len)
    }

    /// The next message, once there is one (for one waiter: the session).
    pub fn poll_pop(&self, cx: &mut Context<'_>) -> Poll<Arc<Outgoing>> {
        if let Some(out) = self.pop() {
            return Poll::Ready(out);
        }
        self.waiting.register(cx.waker());
        // A push between the first look and the registration woke nobody.
        match self.pop() {
            Some(out) => Poll::Ready(out),
            None => Poll::Pending,
        }
    }

    /// Ready once the session must stop, shutdown first. For one waiter
    /// (the session), which polls it every time it is polled, so its waker
    /// is registered whenever it waits for anything.
    pub fn poll_stop(&self, cx: &mut Context<'_>) -> Poll<Stop> {
        if let Some(stop) = self.stopped() {
            return Poll::Ready(stop);
        }
        self.waiting.register(cx.waker());
        // A stop between the first look and the registration woke nobody.
        self.stopped().map_or(Poll::Pending, Poll::Ready)
    }

    fn stopped(&self) -> Option<Stop> {
        let bits = self.stop.load(Ordering::Acquire);
        if bits & STOP_SHUTDOWN != 0 {
            Some(Stop::Shutdown)
        } else if bits & STOP_SLOW != 0 {
            Some(Stop::SlowConsumer)
        } else {
            None
        }
    }

    /// Close the connection as a slow consumer (4008), once and for good;
    /// its session sees it in [`ConnBytes::poll_stop`].
    pub fn kick(&self) {
        self.stop_with(STOP_SLOW);
    }

    pub fn is_kicked(&self) -> bool {
        self.stop.load(Ordering::Acquire) & STOP_SLOW != 0
    }

    fn stop_with(&self, bit: u8) {
        if self.stop.fetch_or(bit, Ordering::AcqRel) & bit == 0 {
            self.waiting.wake();
        }
    }

    /// The session ended: refuse further pushes and let go of what is
    /// queued (and its share of the server's ceiling) now.
    pub fn close_outbox(&self) {
        let queued = self.outbox.lock().expect("outbox lock poisoned").take();
        drop(queued);
    }

    /// Add `len` if the count stays within `limit`, or holds nothing yet (a
    /// frame larger than the bound still reaches a connection that keeps up).
    pub fn try_add(&self, len: usize, limit: usize) -> bool {
        self.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q == 0 || q + len <= limit).then_some(q + len)
            })
            .is_ok()
    }

    /// Add `len` unconditionally (the caller checked the room).
    pub fn add(&self, len: usize) {
        self.queued.fetch_add(len, Ordering::AcqRel);
    }

    pub fn sub(&self, len: usize) {
        self.queued.fetch_sub(len, Ordering::AcqRel);
    }

    pub fn get(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }
}

/// Every socket session of this server, so that shutdown reaches each one
/// through its [`ConnBytes`] (an atomic and a wake) instead of every
/// session polling one shared token. Sharded by connection id; a session
/// is in it from [`Session::new`](crate::gateway::session::Session::new) until it
/// is dropped.
pub struct Sessions {
    shards: Vec<Mutex<HashMap<u64, Arc<ConnBytes>>>>,
    stopping: AtomicBool,
}

impl Default for Sessions {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            stopping: AtomicBool::new(false),
        }
    }
}

impl Sessions {
    fn shard(&self, id: u64) -> &Mutex<HashMap<u64, Arc<ConnBytes>>> {
        &self.shards[(id % SHARDS as u64) as usize]
    }

    /// A new session; told to stop at once when shutdown has begun.
    pub fn add(&self, id: u64, conn: &Arc<ConnBytes>) {
        self.shard(id).lock().expect("sessions lock poisoned").insert(id, conn.clone());
        // `stop_all` sets the flag before it visits the shards: a session
        // added to a shard it already visited sees the flag here.
        if self.stopping.load(Ordering::SeqCst) {
            conn.stop_with(STOP_SHUTDOWN);
        }
    }

    pub fn remove(&self, id: u64) {
        self.shard(id).lock().expect("sessions lock poisoned").remove(&id);
    }

    /// Shutdown: every session, present and future, stops (with 1001).
    pub fn stop_all(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for shard in &self.shards {
            for conn in shard.lock().expect("sessions lock poisoned").values() {
                conn.stop_with(STOP_SHUTDOWN);
            }
        }
    }

    /// Sessions now.
    #[cfg(test)]
    fn count(&self) -> usize {
        self.shards.iter().map(|s| s.lock().expect("sessions lock poisoned").len()).sum()
    }
}

/// One shard of the hub: a channel's local subscribers. Hashed with
/// foldhash, randomly seeded per process (channel names come from clients;
/// a seed they cannot know keeps them from choosing collisions), at a
/// fraction of SipHash's cost on the path of every delivery.
type Shard = RwLock<HashMap<ChannelName, Vec<ConnHandle>, foldhash::fast::RandomState>>;

pub struct Hub {
    shards: Vec<Shard>,
    metrics: Arc<Metrics>,
    /// The server-wide count (`limits.total_outbox_bytes`).
    pub queued: Arc<QueuedBytes>,
    /// `limits.outbox_bytes`.
    conn_bytes: usize,
    /// Time of the last shed, in ms since `born` (see [`Hub::shed`]).
    last_shed: AtomicU64,
    born: Instant,
}

impl Hub {
    pub fn new(metrics: Arc<Metrics>, limits: &Limits) -> Self {
        let queued = Arc::new(QueuedBytes::new(metrics.outbox_bytes.clone(), limits.total_outbox_bytes));
        Self {
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::default())).collect(),
            metrics,
            queued,
            conn_bytes: limits.outbox_bytes,
            last_shed: AtomicU64::new(0),
            born: Instant::now(),
        }
    }

    fn shard(&self, channel: &ChannelName) -> &Shard {
        use std::hash::BuildHasher;
        static HASHER: std::sync::OnceLock<foldhash::fast::RandomState> = std::sync::OnceLock::new();
        let h = HASHER.get_or_init(Default::default).hash_one(channel.as_str());
        &self.shards[(h as usize) % SHARDS]
    }

    /// Add a subscriber. Watching the channel is the engine's business: the
    /// session calls `Log::watch` for each subscription, and the engine
    /// counts them (`herald_core::feed::Watches`).
    pub fn add(&self, channel: &ChannelName, conn: ConnHandle) {
        let mut map = self.shard(channel).write().expect("hub lock poisoned");
        // Most channels have one subscriber (a user's own channel): room
        // for one, not the four a first push would reserve.
        map.entry(channel.clone()).or_insert_with(|| Vec::with_capacity(1)).push(conn);
    }

    /// Remove a subscriber (the session then calls `Log::unwatch`).
    pub fn remove(&self, channel: &ChannelName, conn_id: u64) {
        let mut map = self.shard(channel).write().expect("hub lock poisoned");
        let Some(subs) = map.get_mut(channel) else { return };
        subs.retain(|c| c.id != conn_id);
        if subs.is_empty() {
            map.remove(channel);
        }
    }

    /// Local subscribers of a channel (for tests and metrics).
    pub fn subscriber_count(&self, channel: &ChannelName) -> usize {
        self.shard(channel).read().expect("hub lock poisoned").get(channel).map_or(0, Vec::len)
    }

    /// A connection cannot take `msg`: durable, kick it (the log has the
    /// message, the client resumes from its last seq); volatile, drop it.
    fn refuse(&self, conn: &ConnHandle, msg: &Message) {
        if msg.seq.is_some() {
            conn.bytes.kick();
        } else {
            self.metrics.volatile_dropped.inc();
        }
    }

    /// At the server's ceiling the message is queued for no one: volatile,
    /// dropped; durable, the subscriber is sent a frameless copy, which
    /// makes it read the message from the log when there is room again (no
    /// disconnect). [`Hub::shed`] makes that room.
    fn at_ceiling(&self, conn: &ConnHandle, missed: &Arc<Outgoing>) {
        self.metrics.outbox_full_total.inc();
        if missed.msg.seq.is_none() {
            return self.refuse(conn, &missed.msg);
        }
        if let Err(PushError::Full) = conn.bytes.push(missed.clone()) {
            self.metrics.outbox_full_frames.inc();
            self.refuse(conn, &missed.msg);
        }
    }

    /// Called when something could not be queued for the server's
    /// ceiling: kick the connections holding the most queued bytes (4008,
    /// they resume from the log) until the total is back under three
    /// quarters of the ceiling. Bytes of connections already kicked count as
    /// released (they are, as those sessions end). At most one scan per
    /// `SHED_INTERVAL`, over every local subscription; never awaits.
    pub fn shed(&self) {
        let now = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.last_shed.load(Ordering::Acquire);
        let interval = SHED_INTERVAL.as_millis() as u64;
        let recent = last != 0 && now < last.saturating_add(interval);
        // One caller wins the scan; the others leave it to that one.
        if recent
            || self.last_shed.compare_exchange(last, now.max(1), Ordering::AcqRel, Ordering::Acquire).is_err()
        {
            return;
        }
        let low_water = usize::try_from(self.queued.ceiling / 4 * 3).unwrap_or(0);
        let Some(mut excess) = self.queued.total().checked_sub(low_water).filter(|&e| e > 0) else {
            return;
        };
        let mut holders: HashMap<u64, (usize, Arc<ConnBytes>)> = HashMap::new();
        for shard in &self.shards {
            let map = shard.read().expect("hub lock poisoned");
            for conn in map.values().flatten() {
                let held = conn.bytes.get();
                if held > 0 {
                    holders.entry(conn.id).or_insert_with(|| (held, conn.bytes.clone()));
                }
            }
        }
        let mut largest: Vec<(usize, Arc<ConnBytes>)> = holders
            .into_values()
            .filter(|(held, bytes)| {
                if bytes.is_kicked() {
                    excess = excess.saturating_sub(*held);
                }
                !bytes.is_kicked()
            })
            .collect();
        largest.sort_unstable_by_key(|h| std::cmp::Reverse(h.0));
        for (held, bytes) in largest {
            if excess == 0 {
                break;
            }
            bytes.kick();
            self.metrics.outbox_shed.inc();
            excess = excess.saturating_sub(held);
        }
    }
}

/// A copy of `msg` without its frame.
fn frameless(msg: &Message) -> Message {
    Message {
        channel: msg.channel.clone(),
        seq: msg.seq,
        id: msg.id.clone(),
        ts: msg.ts,
        epoch: msg.epoch.clone(),
        frame: Bytes::new(),
        closes: msg.closes,
    }
}

impl Hub {
    /// Charge one message against the server's ceiling (or mark it missed).
    fn outgoing(&self, msg: Arc<Message>) -> Arc<Outgoing> {
        Arc::new(match self.queued.try_charge(msg.frame.len()) {
            Some(charge) => {
                Outgoing { msg, missed: false, centrifugo: Default::default(), _charge: Some(charge) }
            }
            None => Outgoing {
                msg: Arc::new(frameless(&msg)),
                missed: true,
                centrifugo: Default::default(),
                _charge: None,
            },
        })
    }

    /// Queue one message for one connection, or apply the channel's policy
    /// when its outbox is full.
    fn offer(&self, conn: &ConnHandle, out: &Arc<Outgoing>) {
        if out.missed {
            return self.at_ceiling(conn, out);
        }
        let len = out.msg.frame.len();
        if !conn.bytes.try_add(len, self.conn_bytes) {
            self.metrics.outbox_full_bytes.inc();
            return self.refuse(conn, &out.msg);
        }
        match conn.bytes.push(out.clone()) {
            Ok(()) => {}
            Err(PushError::Full) => {
                conn.bytes.sub(len);
                self.metrics.outbox_full_frames.inc();
                self.refuse(conn, &out.msg);
            }
            // The session is exiting; its cleanup removes this entry.
            Err(PushError::Closed) => conn.bytes.sub(len),
        }
    }

    /// Messages of one channel, in order, handed out connection by
    /// connection: each outbox gets the whole run in one go, so its session
    /// wakes once and writes them together (one flush).
    fn deliver_run(&self, run: &[Arc<Message>]) {
        let Some(first) = run.first() else { return };
        let map = self.shard(&first.channel).read().expect("hub lock poisoned");
        let Some(subs) = map.get(&first.channel) else { return };
        // A run of one (each message of a batch to many channels) needs no
        // list of its own.
        let one;
        let many: Vec<Arc<Outgoing>>;
        let outs: &[Arc<Outgoing>] = if let [m] = run {
            one = [self.outgoing(m.clone())];
            &one
        } else {
            many = run.iter().map(|m| self.outgoing(m.clone())).collect();
            &many
        };
        for conn in subs {
            for out in outs {
                self.offer(conn, out);
            }
        }
        if outs.iter().any(|o| o.missed) {
            drop(map);
            self.shed();
        }
    }
}

impl FanoutSink for Hub {
    fn deliver(&self, msg: Arc<Message>) {
        self.deliver_run(std::slice::from_ref(&msg));
    }

    /// Per channel, runs of consecutive messages go out connection by
    /// connection (see `deliver_run`); each channel's order is kept.
    fn deliver_batch(&self, msgs: Vec<Arc<Message>>) {
        let mut rest = &msgs[..];
        while let Some(first) = rest.first() {
            let n = rest.iter().take_while(|m| m.channel == first.channel).count();
            self.deliver_run(&rest[..n]);
            rest = &rest[n..];
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use herald_core::Epoch;

    use super::*;

    fn outgoing(n: u64, queued: &Arc<QueuedBytes>) -> Arc<Outgoing> {
        let msg = Message {
            channel: ChannelName::new("live:t").unwrap(),
            seq: None,
            id: Arc::from(n.to_string()),
            ts: n,
            epoch: Epoch::new("e".to_owned()),
            frame: Bytes::from(vec![b'x'; 10]),
            closes: false,
        };
        let charge = queued.try_charge(10);
        Arc::new(Outgoing {
            msg: Arc::new(msg),
            missed: false,
            centrifugo: Default::default(),
            _charge: charge,
        })
    }

    #[tokio::test]
    async fn the_outbox_is_bounded_in_order_and_lets_go_when_the_session_ends() {
        let queued = Arc::new(QueuedBytes::new(Gauge::default(), 1 << 20));
        let conn = Arc::new(ConnBytes::new(3));
        for n in 1..=3 {
            conn.push(outgoing(n, &queued)).unwrap();
        }
        assert_eq!(conn.push(outgoing(4, &queued)), Err(PushError::Full));
        assert_eq!(conn.outbox_len(), 3);
        assert_eq!(conn.pop().unwrap().msg.ts, 1, "first in, first out");
        // A waiting session is woken by a push from another task.
        let waiter = {
            let conn = conn.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                for _ in 0..3 {
                    seen.push(poll_fn(|cx| conn.poll_pop(cx)).await.msg.ts);
                }
                seen
            })
        };
        tokio::task::yield_now().await;
        conn.push(outgoing(5, &queued)).unwrap();
        assert_eq!(waiter.await.unwrap(), [2, 3, 5]);
        // Ended: pushes are refused and what was queued is released now.
        conn.push(outgoing(6, &queued)).unwrap();
        assert_eq!(queued.total(), 10);
        conn.close_outbox();
        assert_eq!(queued.total(), 0, "the queued message's charge is released with the outbox");
        assert_eq!(conn.push(outgoing(7, &queued)), Err(PushError::Closed));
        assert!(conn.pop().is_none());
    }

    /// A session waiting on its outbox is woken by a kick or by shutdown
    /// (which wins over a kick), and a session that starts after shutdown
    /// began is stopped at once.
    #[tokio::test]
    async fn kicks_and_shutdown_wake_the_waiting_session() {
        let sessions = Sessions::default();
        let wait = |conn: Arc<ConnBytes>| {
            tokio::spawn(async move {
                // What the session's loop does: the stop first, then the outbox.
                let woken = poll_fn(|cx| match conn.poll_stop(cx) {
                    Poll::Ready(stop) => Poll::Ready(Some(stop)),
                    Poll::Pending => conn.poll_pop(cx).map(|_| None),
                });
                tokio::time::timeout(Duration::from_secs(5), woken)
                    .await
                    .expect("the waiting session was woken")
            })
        };
        let (a, b) = (Arc::new(ConnBytes::new(4)), Arc::new(ConnBytes::new(4)));
        sessions.add(1, &a);
        sessions.add(2, &b);
        let (wa, wb) = (wait(a.clone()), wait(b.clone()));
        tokio::task::yield_now().await;
        a.kick();
        assert_eq!(wa.await.unwrap(), Some(Stop::SlowConsumer));
        assert!(a.is_kicked() && !b.is_kicked());
        assert!(!wb.is_finished(), "another connection's kick does not stop it");
        sessions.remove(1);
        assert_eq!(sessions.count(), 1);
        sessions.stop_all();
        assert_eq!(wb.await.unwrap(), Some(Stop::Shutdown));
        assert_eq!(
            wait(a.clone()).await.unwrap(),
            Some(Stop::SlowConsumer),
            "removed before shutdown: kick only"
        );
        // Shutdown wins over a kick; a session added after it stops at once.
        b.kick();
        assert_eq!(wait(b).await.unwrap(), Some(Stop::Shutdown));
        let late = Arc::new(ConnBytes::new(4));
        sessions.add(3, &late);
        assert_eq!(wait(late).await.unwrap(), Some(Stop::Shutdown));
    }
}
