//! Acked delivery for one subscription on one connection: the in-flight
//! window, the delivered-but-unacked seqs with their redelivery timers, and
//! staleness.
//!
//! Invariants:
//! - `pending` holds exactly the seqs `acked + 1 ..= next - 1` that were
//!   sent on this connection, ascending, each with one live timer in the
//!   session's `Timers` (none once the subscription is stale);
//! - at most `max_inflight` seqs are pending: the session asks [`AckState::room`]
//!   before sending and pauses the subscription at zero;
//! - `acked` never goes backwards.
//!
//! Timers live in one tokio-util `DelayQueue` per connection, created on the
//! first pending message and dropped when none is left, so idle connections
//! pay nothing for it. They are not persisted: on resume the subscription
//! starts after the durable cursor and timers are set again as messages go
//! out.

use std::collections::VecDeque;
use std::time::Duration;

use herald_core::{NamespaceOptions, Seq, SubscriberId};
use herald_proto::ChannelName;
use tokio_util::time::delay_queue::{DelayQueue, Key};

/// Redelivery timers of one connection, by (channel, seq). Boxed: every
/// session holds this field, and an inline `DelayQueue` would cost ~200
/// bytes per connection even when unused.
pub type Timers = Option<Box<DelayQueue<(ChannelName, Seq)>>>;

/// The namespace settings acked delivery needs.
#[derive(Debug, Clone, Copy)]
pub struct AckOpts {
    pub timeout: Duration,
    pub backoff_max: Duration,
    pub max_attempts: u32,
    pub max_inflight: u32,
}

impl From<&NamespaceOptions> for AckOpts {
    fn from(ns: &NamespaceOptions) -> Self {
        Self {
            timeout: ns.ack_timeout,
            backoff_max: ns.ack_backoff_max,
            max_attempts: ns.max_attempts,
            max_inflight: ns.max_inflight,
        }
    }
}

struct Pending {
    seq: Seq,
    /// Deliveries so far on this connection, the first included.
    attempts: u32,
    key: Key,
}

/// What a fired timer asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Expiry {
    /// Already acked or unknown: nothing to do.
    Ignore,
    /// Send the message again; this is delivery number `attempt`.
    Redeliver { attempt: u32 },
    /// `max_attempts` reached: the subscription stops on this connection.
    Stale,
}

pub struct AckState {
    /// Whose cursor this is (token `sub` + device), validated once at
    /// subscribe.
    pub subscriber: SubscriberId,
    /// Highest seq the subscriber has (acked, or claimed with `since`): the
    /// base of the in-flight window.
    pub acked: Seq,
    /// The durable cursor as last stored in the engine; acks at or below it
    /// are not sent to the engine again.
    pub stored: Seq,
    /// Gave up on this connection after `max_attempts`; the inbox keeps the
    /// messages for the next resume.
    pub stale: bool,
    pending: VecDeque<Pending>,
    opts: AckOpts,
}

impl AckState {
    pub fn new(subscriber: SubscriberId, acked: Seq, stored: Seq, opts: AckOpts) -> Self {
        Self { subscriber, acked, stored, stale: false, pending: VecDeque::new(), opts }
    }

    /// How many more messages may be sent now, given the next seq to send.
    pub fn room(&self, next: Seq) -> usize {
        if self.stale {
            return 0;
        }
        let outstanding = next.saturating_sub(1).saturating_sub(self.acked);
        (u64::from(self.opts.max_inflight).saturating_sub(outstanding)) as usize
    }

    /// A first delivery of `seq` went out.
    pub fn on_sent(&mut self, channel: &ChannelName, seq: Seq, timers: &mut Timers) {
        let key = timers
            .get_or_insert_with(|| Box::new(DelayQueue::new()))
            .insert((channel.clone(), seq), self.opts.timeout);
        self.pending.push_back(Pending { seq, attempts: 1, key });
    }

    /// A cumulative ack. Returns whether it advanced the cursor.
    pub fn on_ack(&mut self, seq: Seq, timers: &mut Timers) -> bool {
        if seq <= self.acked {
            return false;
        }
        self.acked = seq;
        while self.pending.front().is_some_and(|p| p.seq <= seq) {
            let p = self.pending.pop_front().expect("front exists");
            remove_timer(timers, &p.key);
        }
        true
    }

    /// The timer of `seq` fired (the queue has already dropped that entry,
    /// and its key may be reused: it is never passed to `try_remove`).
    pub fn on_expired(&mut self, channel: &ChannelName, seq: Seq, timers: &mut Timers) -> Expiry {
        let Ok(i) = self.pending.binary_search_by_key(&seq, |p| p.seq) else { return Expiry::Ignore };
        if self.pending[i].attempts >= self.opts.max_attempts {
            self.pending.remove(i);
            self.clear(timers);
            self.stale = true;
            return Expiry::Stale;
        }
        let attempt = self.pending[i].attempts + 1;
        let delay = backoff(&self.opts, attempt);
        let key =
            timers.get_or_insert_with(|| Box::new(DelayQueue::new())).insert((channel.clone(), seq), delay);
        self.pending[i].attempts = attempt;
        self.pending[i].key = key;
        Expiry::Redeliver { attempt }
    }

    /// Drop every timer of this subscription (unsubscribe, stale).
    pub fn clear(&mut self, timers: &mut Timers) {
        for p in self.pending.drain(..) {
            remove_timer(timers, &p.key);
        }
    }

    #[cfg(test)]
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }
}

fn remove_timer(timers: &mut Timers, key: &Key) {
    if let Some(q) = timers.as_mut() {
        q.try_remove(key);
        if q.is_empty() {
            *timers = None;
        }
    }
}

/// Wait before delivery number `attempt` (>= 2) times out: the ack timeout
/// doubled per earlier attempt, capped, with ±20% jitter so many clients
/// that stalled together do not retry together.
pub fn backoff(opts: &AckOpts, attempt: u32) -> Duration {
    let doublings = attempt.saturating_sub(1).min(20);
    let base = opts.timeout.saturating_mul(1 << doublings).min(opts.backoff_max);
    base.mul_f64(0.8 + 0.4 * fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> AckOpts {
        AckOpts {
            timeout: Duration::from_secs(1),
            backoff_max: Duration::from_secs(10),
            max_attempts: 3,
            max_inflight: 4,
        }
    }

    fn ch() -> ChannelName {
        ChannelName::new("user:1").unwrap()
    }

    #[test]
    fn backoff_doubles_within_jitter_and_caps() {
        let o = opts();
        for _ in 0..100 {
            let d2 = backoff(&o, 2).as_secs_f64();
            assert!((1.6..=2.4).contains(&d2), "{d2}");
            let d3 = backoff(&o, 3).as_secs_f64();
            assert!((3.2..=4.8).contains(&d3), "{d3}");
            let d9 = backoff(&o, 9).as_secs_f64();
            assert!((8.0..=12.0).contains(&d9), "capped: {d9}");
        }
    }

    #[tokio::test]
    async fn window_acks_and_timers() {
        let mut timers: Timers = None;
        let mut s = AckState::new(SubscriberId::new("u", None).unwrap(), 0, 0, opts());
        assert_eq!(s.room(1), 4);
        for seq in 1..=4 {
            s.on_sent(&ch(), seq, &mut timers);
        }
        assert_eq!(s.room(5), 0, "window full");
        assert!(s.on_ack(2, &mut timers));
        assert!(!s.on_ack(1, &mut timers), "acks never go backwards");
        assert_eq!((s.acked, s.pending_len(), s.room(5)), (2, 2, 2));
        assert_eq!(timers.as_ref().unwrap().len(), 2);
        assert!(s.on_ack(4, &mut timers));
        assert!(timers.is_none(), "no pending: no timer queue");
    }

    /// Wait (in paused time) for the next timer and return its seq.
    async fn fire(timers: &mut Timers) -> Seq {
        let q = timers.as_mut().expect("a timer is pending");
        let expired = std::future::poll_fn(|cx| q.poll_expired(cx)).await.expect("an entry");
        expired.into_inner().1
    }

    #[tokio::test(start_paused = true)]
    async fn expiry_redelivers_with_growing_backoff_then_goes_stale() {
        let mut timers: Timers = None;
        let mut s = AckState::new(SubscriberId::new("u", None).unwrap(), 0, 0, opts());
        s.on_sent(&ch(), 1, &mut timers);
        s.on_sent(&ch(), 2, &mut timers);
        let t0 = tokio::time::Instant::now();
        let mut fired = Vec::new();
        loop {
            let seq = fire(&mut timers).await;
            let e = s.on_expired(&ch(), seq, &mut timers);
            fired.push((seq, t0.elapsed().as_secs_f64(), e));
            if s.stale {
                break;
            }
        }
        // Both seqs time out at 1s (attempt 1), are resent, then the first to
        // reach max_attempts makes the subscription stale.
        assert_eq!(fired[0].2, Expiry::Redeliver { attempt: 2 });
        assert!((fired[0].1 - 1.0).abs() < 0.01);
        let second_round = fired.iter().find(|f| f.2 == Expiry::Redeliver { attempt: 3 }).unwrap();
        assert!(second_round.1 >= 1.0 + 1.6 && second_round.1 <= 1.0 + 2.4, "{fired:?}");
        assert_eq!(fired.last().unwrap().2, Expiry::Stale);
        assert!(timers.is_none(), "stale: every timer dropped");
        assert_eq!(s.room(2), 0);
        assert_eq!(s.on_expired(&ch(), 7, &mut timers), Expiry::Ignore);
    }
}
