//! A node's feed of one watched channel: live messages from a transport
//! that may lose some (Redis pub/sub), made gap-free with the log, for an
//! engine to hand to its [`FanoutSink`](crate::FanoutSink).
//!
//! Pure: no I/O, no tokio, no clock, no lock. The engine owns the transport,
//! the reads, the lock around each [`Feed`] and the task that repairs it;
//! the feed decides. Per channel it knows the epoch and the last seq
//! released to the sink, and:
//! - a live message `last + 1` of the epoch is released
//!   ([`Offered::Release`]); one at or below `last` is a duplicate; one
//!   further on is a gap, and one of another epoch means the log must be
//!   asked which epoch stands: both start a repair ([`Offered::Repair`]);
//! - a repair runs in rounds: each reads the log from one before `last`
//!   ([`Feed::round`]), so it also sees whether the message at `last` is
//!   still the one released; the page then either releases what is missing,
//!   in order ([`Step::Released`]), follows a new epoch ([`Step::NewEpoch`]:
//!   the engine hands the sink an epoch marker), or shows the log lost what
//!   was released under the same epoch ([`Step::Lost`]: the engine must
//!   start a new epoch, then [`Feed::follow`] it);
//! - a head check (the engine's periodic look at a quiet channel, or after
//!   its transport reconnected) compares the log's head with `last`
//!   ([`Feed::on_head`]), so a message lost on a quiet channel is found
//!   without waiting for the next one.
//!
//! Invariants, with every call made under the engine's lock of the feed
//! and every release handed to the sink before that lock is let go:
//! - the sink gets the channel's seqs in increasing order, each once,
//!   within an epoch; `last` moves only by a release (a range removed by
//!   retention is skipped: sessions see the jump and report it);
//! - at most one repair runs ([`Feed::is_repairing`]): a start is asked for
//!   only when none runs, and the engine calls [`Feed::end_repair`] when
//!   its repair stops, on every path;
//! - a repair ends only when a round found the log complete, nothing seen
//!   live beyond `last`, and nothing asked for another round meanwhile.
//!
//! Watches are counted here too ([`Watches`]): the one place a node's
//! watch and unwatch calls of a channel are balanced.

mod watches;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use crate::engine::{Epoch, Message, Position, Seq};

pub use watches::Watches;

/// What to do with a live message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offered {
    /// It is `last + 1` of the feed's epoch, now `last`: hand it to the sink
    /// (in the feed's epoch) before letting go of the feed.
    Release,
    /// Nothing now: a duplicate, a feed not started yet, or one a running
    /// repair catches up.
    Skip,
    /// Start a repair (none runs). `gap`: a seq beyond `last + 1` (counted
    /// as a gap); otherwise the message was of another epoch.
    Repair { gap: bool },
}

/// One repair round: read up to `limit` messages after `after`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Round {
    pub after: Seq,
    pub limit: usize,
    /// The feed when the round began, to judge the page against.
    epoch: Option<Epoch>,
    last: Seq,
    last_id: Option<Arc<str>>,
}

impl Round {
    /// The feed's `last` when the round began.
    pub fn last(&self) -> Seq {
        self.last
    }
}

/// What a round's page means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The feed had no epoch: it starts at the log's head (whose message
    /// the next round releases). Go on.
    Started,
    /// The log is in another epoch: the feed follows it, from its head
    /// message. Hand the sink an epoch marker now, then go on. `lost`: the
    /// head is below what was released (the log lost data).
    NewEpoch { epoch: Epoch, previous: Epoch, lost: bool },
    /// Same epoch, but the log lost what was released (its head is below
    /// `last`, or the message at `last` is another one): start a new epoch
    /// in the log (one node wins), then [`follow`](Feed::follow) the one
    /// that stands. Nothing changed in the feed.
    Lost { epoch: Epoch, head: Seq },
    /// The feed's epoch changed (or the feed was started) since the round
    /// began: go on.
    Stale,
    /// `count` messages of the page, those after `last`, were released (the
    /// `release` callback had each, in order). `done`: the repair may end;
    /// otherwise go on.
    Released { count: u64, done: bool },
}

/// What a head check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadCheck {
    /// `last` moved since the check began: messages flow.
    Moving,
    /// The log is at `last`, in the feed's epoch, with the same message.
    InSync,
    /// The log differs. `gap`: same epoch, head beyond `last` (counted as a
    /// gap). `start`: start the repair (none runs; otherwise the running
    /// one makes another round).
    Differs { gap: bool, start: bool },
}

/// One watched channel's feed; see the module docs.
#[derive(Debug, Default)]
pub struct Feed {
    /// `None` until the first read of the channel's position.
    epoch: Option<Epoch>,
    /// The last seq released to the sink (or skipped as settled) in `epoch`.
    last: Seq,
    /// The id of the message at `last`, when known.
    last_id: Option<Arc<str>>,
    /// The highest seq seen live in `epoch` and not released yet.
    max_seen: Seq,
    /// A repair runs.
    repairing: bool,
    /// The repair must make one more round (something changed meanwhile).
    again: bool,
}

impl Feed {
    /// A feed that does not know the channel's position yet: live messages
    /// are skipped until [`start`](Feed::start) or a repair starts it.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the feed knows its epoch.
    pub fn is_started(&self) -> bool {
        self.epoch.is_some()
    }

    pub fn epoch(&self) -> Option<&Epoch> {
        self.epoch.as_ref()
    }

    /// The last seq released (0 before any).
    pub fn last(&self) -> Seq {
        self.last
    }

    pub fn is_repairing(&self) -> bool {
        self.repairing
    }

    /// The channel's position, read after the transport subscribed (so
    /// whatever commits later comes live). The feed starts one before the
    /// head: the repair then releases the head message once, so a
    /// subscriber that read the position before the feed existed sees a
    /// gap and reads the log instead of waiting for the next message.
    /// Returns whether to start the repair. A started feed ignores it.
    pub fn start(&mut self, position: &Position) -> bool {
        if self.epoch.is_some() {
            return false;
        }
        self.epoch = Some(position.epoch.clone());
        self.last = position.head.saturating_sub(1);
        position.head > 0 && self.begin_repair()
    }

    /// Ask for a repair (a feed not started yet starts with it). Returns
    /// whether to start one.
    pub fn request_repair(&mut self) -> bool {
        self.begin_repair()
    }

    /// Something may have been missed (the transport resubscribed): one
    /// more round. Returns whether to start the repair; `false` also for a
    /// feed not started (its start reads the log anyway).
    pub fn recheck(&mut self) -> bool {
        if self.epoch.is_none() {
            return false;
        }
        self.again = true;
        self.begin_repair()
    }

    fn begin_repair(&mut self) -> bool {
        if self.repairing {
            return false;
        }
        self.repairing = true;
        true
    }

    /// The repair stopped (done, failed, or cancelled): a later one may
    /// start.
    pub fn end_repair(&mut self) {
        self.repairing = false;
    }

    /// A live message: `seq` in `epoch` (as the transport names it), with
    /// message id `id`.
    pub fn offer(&mut self, seq: Seq, epoch: &str, id: &Arc<str>) -> Offered {
        let Some(current) = &self.epoch else { return Offered::Skip };
        if current.as_str() != epoch {
            // Only a read tells which epoch stands (the transport may still
            // carry messages of the one before).
            self.again = true;
            return if self.begin_repair() { Offered::Repair { gap: false } } else { Offered::Skip };
        }
        if seq <= self.last {
            return Offered::Skip;
        }
        if seq == self.last + 1 {
            self.last = seq;
            self.last_id = Some(id.clone());
            return Offered::Release;
        }
        self.max_seen = self.max_seen.max(seq);
        if self.begin_repair() {
            Offered::Repair { gap: true }
        } else {
            Offered::Skip
        }
    }

    /// Begin a repair round, pages of at most `limit` messages (at least 2:
    /// a page starts with the message at `last`).
    pub fn round(&mut self, limit: usize) -> Round {
        self.again = false;
        Round {
            // One before `last`: the page shows whether the message at
            // `last` is still the one released.
            after: self.last.saturating_sub(1),
            limit: limit.max(2),
            epoch: self.epoch.clone(),
            last: self.last,
            last_id: self.last_id.clone(),
        }
    }

    /// The page read for `round`: the log's `position` and `messages`
    /// (ascending). Each message to hand to the sink goes to `release`, in
    /// order, before this returns.
    pub fn on_page(
        &mut self,
        round: &Round,
        position: &Position,
        messages: &[Arc<Message>],
        mut release: impl FnMut(&Arc<Message>),
    ) -> Step {
        let Some(epoch) = &round.epoch else {
            if self.epoch.is_some() {
                // Started (by `start`) while this page was read: what it
                // released since must not be released again.
                return Step::Stale;
            }
            self.epoch = Some(position.epoch.clone());
            self.last = position.head.saturating_sub(1);
            return Step::Started;
        };
        if position.epoch != *epoch {
            self.follow(position.epoch.clone(), position.head);
            return Step::NewEpoch {
                epoch: position.epoch.clone(),
                previous: epoch.clone(),
                lost: position.head < round.last,
            };
        }
        let at_last = messages.iter().find(|m| m.seq == Some(round.last));
        let rewritten = match (at_last, &round.last_id) {
            (Some(m), Some(id)) => m.id != *id,
            _ => false,
        };
        if position.head < round.last || rewritten {
            return Step::Lost { epoch: epoch.clone(), head: position.head };
        }
        if self.epoch.as_ref() != Some(epoch) {
            return Step::Stale;
        }
        let mut count = 0;
        for m in messages {
            let Some(seq) = m.seq else { continue };
            if seq <= self.last {
                continue;
            }
            // `seq > last + 1` only when retention removed the range in
            // between.
            self.last = seq;
            self.last_id = Some(m.id.clone());
            count += 1;
            release(m);
        }
        let complete = messages.len() < round.limit;
        let done = complete && self.max_seen <= self.last && !self.again;
        if done {
            self.max_seen = 0;
        }
        Step::Released { count, done }
    }

    /// Follow `epoch` (after a [`Step::Lost`], the one that now stands):
    /// the feed restarts one before `head`, so the next round releases the
    /// head message of the new epoch. Hand the sink an epoch marker now.
    pub fn follow(&mut self, epoch: Epoch, head: Seq) {
        self.epoch = Some(epoch);
        self.last = head.saturating_sub(1);
        self.last_id = None;
        self.max_seen = 0;
    }

    /// A head check that began when the feed was at `last` found the log in
    /// `epoch` at `head`, with message id `id_at_last` at `last` (empty:
    /// unknown).
    pub fn on_head(&mut self, last: Seq, epoch: &str, head: Seq, id_at_last: &str) -> HeadCheck {
        if self.last != last {
            return HeadCheck::Moving;
        }
        let same_epoch = self.epoch.as_ref().is_some_and(|e| e.as_str() == epoch);
        let same_id = id_at_last.is_empty() || self.last_id.as_deref().is_none_or(|l| l == id_at_last);
        if same_epoch && head == last && same_id {
            return HeadCheck::InSync;
        }
        self.again = true;
        HeadCheck::Differs { gap: same_epoch && head > last, start: self.begin_repair() }
    }
}
