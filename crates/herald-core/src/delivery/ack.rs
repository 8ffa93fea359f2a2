//! The acked window of one subscription: delivered-but-unacked seqs with
//! their redelivery timers, the stored cursor, staleness.
//!
//! Invariants:
//! - `pending` holds exactly the seqs `acked + 1 ..= next - 1` sent as first
//!   deliveries on this connection, ascending, each with one live timer
//!   (none once stale);
//! - at most `max_inflight` seqs are pending (callers ask [`AckWindow::room`]);
//! - `acked` and `stored` never go backwards.

use std::collections::VecDeque;
use std::time::Duration;

use crate::engine::Seq;
use crate::namespace::NamespaceOptions;

/// The caller's timer queue. A key is spent when its timer fires: it is
/// never cancelled afterwards.
pub trait Timers {
    type Key;
    /// Fire for `seq` after `after`.
    fn set(&mut self, seq: Seq, after: Duration) -> Self::Key;
    fn cancel(&mut self, key: Self::Key);
}

/// The namespace settings acked delivery needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// What a fired timer asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Already acked or unknown: nothing to do.
    Ignore,
    /// Read `seq` and send it again, marked as delivery number `attempt`.
    Redeliver { attempt: u32 },
    /// `max_attempts` reached: the subscription stops on this connection;
    /// the stored cursor keeps the rest for the next resume.
    Stale,
}

#[derive(Debug)]
struct Pending<K> {
    seq: Seq,
    /// Deliveries so far on this connection, the first included.
    attempts: u32,
    key: K,
}

#[derive(Debug)]
pub struct AckWindow<K> {
    /// Highest seq the subscriber has (acked, or claimed with `since`).
    acked: Seq,
    /// The cursor as last stored in the engine.
    stored: Seq,
    stale: bool,
    pending: VecDeque<Pending<K>>,
    opts: AckOpts,
}

impl<K> AckWindow<K> {
    pub fn new(acked: Seq, stored: Seq, opts: AckOpts) -> Self {
        Self { acked, stored, stale: false, pending: VecDeque::new(), opts }
    }

    pub fn acked(&self) -> Seq {
        self.acked
    }

    pub fn stored(&self) -> Seq {
        self.stored
    }

    pub fn is_stale(&self) -> bool {
        self.stale
    }

    /// How many more first deliveries may go out, given the next seq.
    pub fn room(&self, next: Seq) -> usize {
        if self.stale {
            return 0;
        }
        let outstanding = next.saturating_sub(1).saturating_sub(self.acked);
        u64::from(self.opts.max_inflight).saturating_sub(outstanding) as usize
    }

    /// A first delivery of `seq` went out.
    pub fn on_sent(&mut self, seq: Seq, timers: &mut impl Timers<Key = K>) {
        let key = timers.set(seq, self.opts.timeout);
        self.pending.push_back(Pending { seq, attempts: 1, key });
    }

    /// A cumulative ack of `seq`, stored as `stored`.
    pub fn on_ack(&mut self, seq: Seq, stored: Seq, timers: &mut impl Timers<Key = K>) {
        self.stored = self.stored.max(stored);
        if seq <= self.acked {
            return;
        }
        self.acked = seq;
        while self.pending.front().is_some_and(|p| p.seq <= seq) {
            let p = self.pending.pop_front().expect("front exists");
            timers.cancel(p.key);
        }
    }

    /// The timer of `seq` fired.
    pub fn on_expired(&mut self, seq: Seq, timers: &mut impl Timers<Key = K>) -> Expiry {
        let Ok(i) = self.pending.binary_search_by_key(&seq, |p| p.seq) else { return Expiry::Ignore };
        if self.pending[i].attempts >= self.opts.max_attempts {
            // Its own key is spent; cancel the others.
            self.pending.remove(i);
            self.clear(timers);
            self.stale = true;
            return Expiry::Stale;
        }
        let attempt = self.pending[i].attempts + 1;
        self.pending[i].attempts = attempt;
        self.pending[i].key = timers.set(seq, backoff(&self.opts, attempt));
        Expiry::Redeliver { attempt }
    }

    /// Drop every timer (unsubscribe, stale).
    pub fn clear(&mut self, timers: &mut impl Timers<Key = K>) {
        for p in self.pending.drain(..) {
            timers.cancel(p.key);
        }
    }

    /// Seqs awaiting an ack, ascending.
    pub fn pending(&self) -> impl Iterator<Item = Seq> + '_ {
        self.pending.iter().map(|p| p.seq)
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
