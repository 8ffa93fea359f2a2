//! The session registry and shedding: every socket session's
//! [`Mailbox`], through which shutdown stops them all, and the kicking of
//! the connections holding the most bytes when the server reaches its
//! ceiling ([`Hub::shed`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Hub, Mailbox, SHARDS};

/// Least time between two sheds: kicked connections need a moment to let
/// go of what they hold.
const SHED_INTERVAL: Duration = Duration::from_millis(100);

/// Every socket session of this server, so that shutdown reaches each one
/// through its [`Mailbox`] (an atomic and a wake) instead of every
/// session polling one shared token. Sharded by connection id; a session
/// is in it from `Session::new` until it is dropped.
pub struct Sessions {
    shards: Vec<Mutex<HashMap<u64, Arc<Mailbox>>>>,
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
    fn shard(&self, id: u64) -> &Mutex<HashMap<u64, Arc<Mailbox>>> {
        &self.shards[(id % SHARDS as u64) as usize]
    }

    /// A new session; told to stop at once when shutdown has begun.
    pub fn add(&self, id: u64, conn: &Arc<Mailbox>) {
        self.shard(id).lock().expect("sessions lock poisoned").insert(id, conn.clone());
        // `stop_all` sets the flag before it visits the shards: a session
        // added to a shard it already visited sees the flag here.
        if self.stopping.load(Ordering::SeqCst) {
            conn.shut_down();
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
                conn.shut_down();
            }
        }
    }

    /// Sessions now.
    #[cfg(test)]
    fn count(&self) -> usize {
        self.shards.iter().map(|s| s.lock().expect("sessions lock poisoned").len()).sum()
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
                let held = conn.mailbox.get();
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
}
