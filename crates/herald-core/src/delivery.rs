//! The delivery state machine of one durable subscription on one
//! connection: where it starts (`since`, epochs, truncation, the acked
//! cursor), the seam between catch-up and live, gap and epoch checks, the
//! acked window with its redelivery timers, and staleness.
//!
//! Pure: no I/O, no tokio, no clock. Inputs are live messages, log pages,
//! acks and timer firings; outputs say what to send and what to read. The
//! caller (a socket session today; a second socket protocol or a webhook
//! consumer tomorrow) owns the socket, the reads and the timer queue, and
//! hands the timer queue in as a [`Timers`].
//!
//! Invariants, for every subscription:
//! - first deliveries go out in seq order, each seq once, with no gap: `next`
//!   only moves to `seq + 1` after `seq` was handed out, and only by one
//!   live message equal to `next` or by a log page that starts at `next`;
//! - a live message of another epoch, or one past `next` (a gap), never goes
//!   out: the subscription goes back to reading the log from `next`, and a
//!   page of another epoch (or one that starts past `next`: trimmed) means
//!   the client must resync;
//! - while reading, live messages are skipped: the read that follows
//!   includes them, because the caller registers for live messages before
//!   it reads the position the subscription starts from;
//! - acked: at most `max_inflight` seqs are unacked, each with one timer;
//!   `acked` never goes backwards; a stale subscription sends nothing more
//!   and holds no timer.

mod ack;
mod resume;

#[cfg(test)]
mod tests;

use crate::engine::{Epoch, Position, Seq};

pub use ack::{backoff, AckOpts, AckWindow, Expiry, Timers};
pub use resume::{resolve, AckedStart, BeyondHead, Start};

/// What to do with a live message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Live {
    /// Send it (a first delivery).
    Send,
    /// Not now: a duplicate, or the subscription is reading the log (which
    /// will include it), or its acked window is full.
    Skip,
    /// A gap or another epoch: the subscription now reads the log from
    /// where it is; queue a read (see [`Subscription::read`]).
    Read,
}

/// A log read to issue: messages after `after`, at most `limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    pub after: Seq,
    pub limit: usize,
}

/// What to do with a page read for this subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paged {
    /// Send the page's messages, in order. `more`: queue another read.
    Send { more: bool },
    /// The log was reset or trimmed past what the client has: it must
    /// resubscribe (the reply will say why). Nothing of the page is sent.
    Resync,
    /// The read no longer matches the subscription: send nothing of it.
    Ignore { more: bool },
}

/// Why an ack is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckRefused {
    /// The subscription is not acked.
    NotAcked,
    /// The seq has not been delivered on this subscription yet.
    NotDelivered { next: Seq },
}

/// What an accepted ack needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckStep {
    /// Already stored: nothing to write (acks are idempotent).
    Stored,
    /// Store the cursor at `seq`, then call [`Subscription::on_acked`].
    Store { seq: Seq },
}

/// One durable subscription's delivery state. `K` is the caller's timer key.
#[derive(Debug)]
pub struct Subscription<K> {
    epoch: Epoch,
    /// The next seq to deliver for the first time.
    next: Seq,
    /// Reading from the log instead of taking live messages (also while an
    /// acked window is full: paused until an ack opens it).
    reading: bool,
    ack: Option<Box<AckWindow<K>>>,
}

impl<K> Subscription<K> {
    /// Before the start position is known: reading (so live messages that
    /// arrive meanwhile are skipped), from nothing.
    pub fn starting() -> Self {
        Self { epoch: Epoch::new(""), next: 1, reading: true, ack: None }
    }

    /// Start delivering from a resolved start; `ack` for acked channels.
    pub fn start(start: &Start, ack: Option<AckOpts>) -> Self {
        Self {
            epoch: start.epoch.clone(),
            next: start.next,
            reading: start.next <= start.head,
            ack: ack.map(|opts| Box::new(AckWindow::new(start.next - 1, start.stored, opts))),
        }
    }

    pub fn epoch(&self) -> &Epoch {
        &self.epoch
    }

    /// The next seq to deliver for the first time.
    pub fn next(&self) -> Seq {
        self.next
    }

    pub fn is_acked(&self) -> bool {
        self.ack.is_some()
    }

    /// Acked and given up on this connection (`max_attempts` reached).
    pub fn is_stale(&self) -> bool {
        self.ack.as_ref().is_some_and(|a| a.is_stale())
    }

    /// Taking live messages (not reading the log, not paused).
    pub fn is_live(&self) -> bool {
        !self.reading
    }

    /// Whether a read should be queued for this subscription now.
    pub fn wants_read(&self) -> bool {
        self.reading && self.room() > 0
    }

    /// How many first deliveries may go out now.
    fn room(&self) -> usize {
        self.ack.as_ref().map_or(usize::MAX, |a| a.room(self.next))
    }

    /// The read to issue now, pages of at most `page` messages; `None` when
    /// live or paused by a full window.
    pub fn read(&self, page: usize) -> Option<Read> {
        self.wants_read().then(|| Read { after: self.next - 1, limit: self.room().min(page) })
    }

    /// A live message with `seq` of `epoch` arrived.
    pub fn on_live(&mut self, seq: Seq, epoch: &Epoch, timers: &mut impl Timers<Key = K>) -> Live {
        if self.reading {
            return Live::Skip;
        }
        // The epoch first: a reset log numbers its seqs again, so a message
        // of another epoch may carry a seq this subscription already passed.
        if *epoch != self.epoch || seq > self.next {
            self.reading = true;
            return Live::Read;
        }
        if seq < self.next {
            return Live::Skip;
        }
        if let Some(ack) = self.ack.as_mut() {
            if ack.room(self.next) == 0 {
                // Window full: pause; the ack that opens it asks for a read.
                self.reading = true;
                return Live::Skip;
            }
            ack.on_sent(seq, timers);
        }
        self.next = seq + 1;
        Live::Send
    }

    /// A page answered the read `read`: `position` is the log's position
    /// when it was read, `seqs` the page's seqs in order.
    pub fn on_page(
        &mut self,
        read: Read,
        position: &Position,
        seqs: impl IntoIterator<Item = Seq>,
        timers: &mut impl Timers<Key = K>,
    ) -> Paged {
        if read.after + 1 != self.next || !self.reading {
            // Overtaken by delivery: cannot happen while the caller has one
            // read in flight per subscription and handles nothing else
            // meanwhile, but sending it would break the order.
            return Paged::Ignore { more: self.wants_read() };
        }
        if position.epoch != self.epoch {
            return Paged::Resync;
        }
        let mut count = 0;
        for seq in seqs {
            if seq != self.next {
                // Starts past `next` (trimmed meanwhile) or has a hole: what
                // the client needs is gone.
                return Paged::Resync;
            }
            if let Some(ack) = self.ack.as_mut() {
                ack.on_sent(seq, timers);
            }
            self.next = seq + 1;
            count += 1;
        }
        if count == 0 && position.first > self.next {
            return Paged::Resync;
        }
        if count < read.limit {
            // The log is exhausted: everything after it comes live.
            self.reading = false;
        }
        Paged::Send { more: self.wants_read() }
    }

    /// Check an ack of `seq` before storing it.
    pub fn check_ack(&self, seq: Seq) -> Result<AckStep, AckRefused> {
        let Some(ack) = self.ack.as_ref() else { return Err(AckRefused::NotAcked) };
        if seq >= self.next {
            return Err(AckRefused::NotDelivered { next: self.next });
        }
        if seq <= ack.stored() {
            return Ok(AckStep::Stored);
        }
        Ok(AckStep::Store { seq })
    }

    /// The cursor was stored at `stored` (≥ `seq`) after an ack of `seq`.
    /// Returns whether a read should be queued (a paused window opened).
    pub fn on_acked(&mut self, seq: Seq, stored: Seq, timers: &mut impl Timers<Key = K>) -> bool {
        let Some(ack) = self.ack.as_mut() else { return false };
        ack.on_ack(seq, stored, timers);
        self.wants_read()
    }

    /// The timer of `seq` fired (its key is spent).
    pub fn on_timer(&mut self, seq: Seq, timers: &mut impl Timers<Key = K>) -> Expiry {
        match self.ack.as_mut() {
            Some(ack) => ack.on_expired(seq, timers),
            None => Expiry::Ignore,
        }
    }

    /// The subscription ends (unsubscribe, channel closed): drop its timers.
    pub fn end(&mut self, timers: &mut impl Timers<Key = K>) {
        if let Some(ack) = self.ack.as_mut() {
            ack.clear(timers);
        }
    }
}
