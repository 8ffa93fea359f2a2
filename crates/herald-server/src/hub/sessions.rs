//! The session registry and shedding: every socket session's
//! [`Mailbox`], through which a drain closes them one by one and shutdown
//! stops them all, and the kicking of the connections holding the most
//! bytes when the server reaches its ceiling ([`Hub::shed`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Hub, Mailbox, SHARDS};

/// Least time between two sheds: kicked connections need a moment to let
/// go of what they hold.
const SHED_INTERVAL: Duration = Duration::from_millis(100);

/// Who a session serves, once it is known (at the upgrade on `/ws`, at
/// `connect` on the Centrifugo endpoint): what the backend's actions pick
/// connections by and the connection listing shows.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    pub user: Arc<str>,
    pub device: Option<Arc<str>>,
    /// The protocol's label (`herald`, `centrifugo`, `centrifugo_protobuf`).
    pub protocol: &'static str,
    pub connected_at_ms: u64,
    /// The client's address as the proxy in front reports it
    /// (`X-Forwarded-For`'s first entry, else `X-Real-IP`).
    pub remote: Option<Arc<str>>,
    /// The token's `iat` (seconds); `None` without a token.
    pub iat: Option<u64>,
}

/// One registered session.
struct Entry {
    mailbox: Arc<Mailbox>,
    info: Option<Arc<SessionInfo>>,
}

/// Every socket session of this server, so that shutdown reaches each one
/// through its [`Mailbox`] (an atomic and a wake) instead of every
/// session polling one shared token, and the backend's actions reach a
/// user's sessions. Sharded by connection id; a session is in it from
/// `Session::new` until it is dropped. The user index holds the ids of
/// every identified session, sharded by user; an id is in it exactly while
/// its entry is registered with that user's [`SessionInfo`].
pub struct Sessions {
    shards: Vec<Mutex<HashMap<u64, Entry>>>,
    users: Vec<Mutex<HashMap<Arc<str>, Vec<u64>>>>,
    stopping: AtomicBool,
    /// A drain began ([`Sessions::drain`]); for good.
    draining: AtomicBool,
    /// Cancelled to close what the drain has not closed yet at once.
    hurry: CancellationToken,
    /// Cancelled when the drain has told every session.
    drained: CancellationToken,
}

impl Default for Sessions {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            users: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            stopping: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            hurry: CancellationToken::new(),
            drained: CancellationToken::new(),
        }
    }
}

impl Sessions {
    fn shard(&self, id: u64) -> &Mutex<HashMap<u64, Entry>> {
        &self.shards[(id % SHARDS as u64) as usize]
    }

    fn user_shard(&self, user: &str) -> &Mutex<HashMap<Arc<str>, Vec<u64>>> {
        use std::hash::BuildHasher;
        static HASHER: std::sync::OnceLock<foldhash::fast::RandomState> = std::sync::OnceLock::new();
        let h = HASHER.get_or_init(Default::default).hash_one(user);
        &self.users[(h as usize) % SHARDS]
    }

    /// A new session; told to stop at once when shutdown has begun.
    pub fn add(&self, id: u64, conn: &Arc<Mailbox>) {
        self.shard(id)
            .lock()
            .expect("sessions lock poisoned")
            .insert(id, Entry { mailbox: conn.clone(), info: None });
        // `stop_all` sets the flag before it visits the shards: a session
        // added to a shard it already visited sees the flag here.
        if self.stopping.load(Ordering::SeqCst) {
            conn.shut_down();
        }
    }

    pub fn remove(&self, id: u64) {
        let removed = self.shard(id).lock().expect("sessions lock poisoned").remove(&id);
        if let Some(info) = removed.and_then(|e| e.info) {
            self.unindex(&info.user, id);
        }
    }

    /// Say who session `id` serves (a second call, after a token refresh,
    /// replaces the first and keeps its `connected_at_ms`). Nothing if the
    /// session is gone.
    pub fn identify(&self, id: u64, mut info: SessionInfo) {
        // Indexed under the entry's shard lock (then the user's), so a
        // concurrent `remove`, which takes the entry first, finds the
        // index entry to remove.
        let mut shard = self.shard(id).lock().expect("sessions lock poisoned");
        let Some(entry) = shard.get_mut(&id) else { return };
        // A new identity on the same connection (a token refresh): the
        // connection is as old as it was.
        if let Some(previous) = &entry.info {
            info.connected_at_ms = previous.connected_at_ms;
        }
        let info = Arc::new(info);
        if let Some(previous) = entry.info.replace(info.clone()) {
            self.unindex(&previous.user, id);
        }
        self.user_shard(&info.user)
            .lock()
            .expect("sessions lock poisoned")
            .entry(info.user.clone())
            .or_default()
            .push(id);
    }

    fn unindex(&self, user: &Arc<str>, id: u64) {
        let mut users = self.user_shard(user).lock().expect("sessions lock poisoned");
        if let Some(ids) = users.get_mut(user) {
            if let Some(at) = ids.iter().position(|&i| i == id) {
                ids.swap_remove(at);
            }
            if ids.is_empty() {
                users.remove(user);
            }
        }
    }

    /// The identified sessions of `user` on this node, by connection id.
    pub fn of_user(&self, user: &str) -> Vec<(u64, Arc<SessionInfo>, Arc<Mailbox>)> {
        let ids = self.user_shard(user).lock().expect("sessions lock poisoned").get(user).cloned();
        let mut out = Vec::new();
        for id in ids.unwrap_or_default() {
            let shard = self.shard(id).lock().expect("sessions lock poisoned");
            if let Some(Entry { mailbox, info: Some(info) }) = shard.get(&id) {
                out.push((id, info.clone(), mailbox.clone()));
            }
        }
        out.sort_unstable_by_key(|s| s.0);
        out
    }

    /// Sessions open now.
    pub fn count(&self) -> usize {
        self.shards.iter().map(|s| s.lock().expect("sessions lock poisoned").len()).sum()
    }

    /// Whether a drain began: the node takes no new sessions and says it is
    /// not ready.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Drain: close every open session (4010, "reconnect elsewhere now"),
    /// one at a time, spread evenly over `period` (the first at once), so
    /// their reconnects reach the other nodes as a steady stream, not a
    /// burst; after `bound`, or on [`Sessions::hurry`], the rest at once.
    /// New sessions are refused meanwhile (the upgrade checks
    /// [`Sessions::is_draining`]). Returns once every session was told; a
    /// second call waits for the first one's end.
    pub async fn drain(&self, period: Duration, bound: Duration) {
        if self.draining.swap(true, Ordering::SeqCst) {
            self.drained.cancelled().await;
            return;
        }
        let conns = self.snapshot();
        let start = Instant::now();
        let deadline = start + bound;
        let step = period.checked_div(u32::try_from(conns.len()).unwrap_or(u32::MAX)).unwrap_or_default();
        tracing::info!(connections = conns.len(), ?period, "draining");
        let mut next = start;
        let mut conns = conns.into_iter();
        for conn in conns.by_ref() {
            if next > Instant::now() {
                tokio::select! {
                    () = tokio::time::sleep_until(next.min(deadline)) => {}
                    () = self.hurry.cancelled() => {
                        conn.drain();
                        break;
                    }
                }
            }
            conn.drain();
            next += step;
            if Instant::now() >= deadline {
                break;
            }
        }
        let rest: Vec<_> = conns.collect();
        if !rest.is_empty() {
            tracing::info!(connections = rest.len(), "drain cut short: closing the rest at once");
        }
        for conn in rest {
            conn.drain();
        }
        self.drained.cancel();
    }

    /// Resolves once a drain has told every session.
    pub async fn drained(&self) {
        self.drained.cancelled().await;
    }

    /// Close what the drain has not closed yet at once (a second SIGTERM).
    pub fn hurry(&self) {
        self.hurry.cancel();
    }

    /// Shutdown: every session, present and future, stops (with 1001).
    pub fn stop_all(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for shard in &self.shards {
            for entry in shard.lock().expect("sessions lock poisoned").values() {
                entry.mailbox.shut_down();
            }
        }
    }

    /// The sessions open now, to drain one by one.
    pub fn snapshot(&self) -> Vec<Arc<Mailbox>> {
        let mut out = Vec::new();
        for shard in &self.shards {
            out.extend(shard.lock().expect("sessions lock poisoned").values().map(|e| e.mailbox.clone()));
        }
        out
    }
}

impl Hub {
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
        let low_water = self.queued.ceiling() / 4 * 3;
        let Some(mut excess) = self.queued.total().checked_sub(low_water).filter(|&e| e > 0) else {
            return;
        };
        let mut holders: HashMap<u64, (usize, Arc<Mailbox>)> = HashMap::new();
        for shard in &self.shards {
            let map = shard.read().expect("hub lock poisoned");
            for conn in map.values().flatten() {
                let held = conn.mailbox.queued.get();
                if held > 0 {
                    holders.entry(conn.id).or_insert_with(|| (held, conn.mailbox.clone()));
                }
            }
        }
        let mut largest: Vec<(usize, Arc<Mailbox>)> = holders
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

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::task::Poll;

    use super::*;
    use crate::hub::Stop;

    /// A session waiting on its outbox is woken by a kick or by shutdown
    /// (which wins over a kick), and a session that starts after shutdown
    /// began is stopped at once.
    #[tokio::test]
    async fn kicks_and_shutdown_wake_the_waiting_session() {
        let sessions = Sessions::default();
        let wait = |conn: Arc<Mailbox>| {
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
        let (a, b) = (Arc::new(Mailbox::new(4)), Arc::new(Mailbox::new(4)));
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
        let late = Arc::new(Mailbox::new(4));
        sessions.add(3, &late);
        assert_eq!(wait(late).await.unwrap(), Some(Stop::Shutdown));
    }

    fn info(user: &str, device: &str, at: u64) -> SessionInfo {
        SessionInfo {
            user: Arc::from(user),
            device: Some(Arc::from(device)),
            protocol: "herald",
            connected_at_ms: at,
            remote: None,
            iat: None,
        }
    }

    /// The user index follows identification, re-identification and
    /// removal; a refresh keeps the connection's age.
    #[test]
    fn sessions_are_found_by_user_while_registered() {
        let sessions = Sessions::default();
        let conns = open(&sessions, 3);
        sessions.identify(0, info("ann", "a", 10));
        sessions.identify(1, info("ann", "b", 11));
        sessions.identify(2, info("bob", "a", 12));
        let ids = |u: &str| sessions.of_user(u).iter().map(|s| s.0).collect::<Vec<_>>();
        assert_eq!((ids("ann"), ids("bob"), ids("cy")), (vec![0, 1], vec![2], vec![]));
        sessions.identify(1, info("ann", "b", 99));
        assert_eq!(sessions.of_user("ann")[1].1.connected_at_ms, 11, "a refresh keeps the age");
        assert_eq!(ids("ann"), [0, 1], "indexed once");
        sessions.remove(0);
        assert_eq!(ids("ann"), [1]);
        sessions.identify(7, info("ann", "z", 1));
        assert_eq!(ids("ann"), [1], "a session never added is not indexed");
        sessions.remove(1);
        sessions.remove(2);
        assert!(sessions.of_user("ann").is_empty() && sessions.of_user("bob").is_empty());
        assert!(sessions.users.iter().all(|s| s.lock().unwrap().is_empty()), "no empty entries left");
        drop(conns);
    }

    fn drained(conns: &[Arc<Mailbox>]) -> usize {
        let mut cx = std::task::Context::from_waker(futures_util::task::noop_waker_ref());
        conns.iter().filter(|c| matches!(c.poll_stop(&mut cx), Poll::Ready(Stop::Drain))).count()
    }

    fn open(sessions: &Sessions, n: u64) -> Vec<Arc<Mailbox>> {
        (0..n)
            .map(|i| {
                let m = Arc::new(Mailbox::new(4));
                sessions.add(i, &m);
                m
            })
            .collect()
    }

    /// Sleep until `start + t`, then let the drain task act on what is due.
    async fn at(t: Duration, start: Instant) {
        tokio::time::sleep_until(start + t).await;
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
    }

    /// A drain closes one session per `period / n`, the first at once; a
    /// second call waits for the first; `hurry` closes the rest at once.
    #[tokio::test(start_paused = true)]
    async fn a_drain_spreads_the_closes_over_its_period_until_hurried() {
        let sessions = Arc::new(Sessions::default());
        let conns = open(&sessions, 10);
        let start = Instant::now();
        let s = sessions.clone();
        let first =
            tokio::spawn(async move { s.drain(Duration::from_secs(10), Duration::from_secs(60)).await });
        at(Duration::from_millis(100), start).await;
        assert!(sessions.is_draining());
        assert_eq!(drained(&conns), 1, "the first at once");
        at(Duration::from_millis(4500), start).await;
        assert_eq!(drained(&conns), 5, "one a second");
        let s = sessions.clone();
        let second =
            tokio::spawn(async move { s.drain(Duration::from_secs(10), Duration::from_secs(60)).await });
        at(Duration::from_millis(4600), start).await;
        assert!(!second.is_finished(), "a second drain waits for the first");
        sessions.hurry();
        first.await.unwrap();
        second.await.unwrap();
        assert_eq!(drained(&conns), 10, "hurried: the rest at once");
        assert!(Instant::now() < start + Duration::from_secs(5));
    }

    /// The bound (`shutdown.grace`) cuts a drain longer than it short.
    #[tokio::test(start_paused = true)]
    async fn the_bound_closes_the_rest_at_once() {
        let sessions = Arc::new(Sessions::default());
        let conns = open(&sessions, 10);
        let start = Instant::now();
        sessions.drain(Duration::from_secs(10), Duration::from_secs(3)).await;
        assert_eq!(drained(&conns), 10);
        let took = Instant::now() - start;
        assert!(took >= Duration::from_secs(3) && took < Duration::from_secs(4), "{took:?}");
    }
}
