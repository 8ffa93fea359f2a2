//! Delivery verification and the counts workers report.
//!
//! Every subscription expects the publisher's sequence numbers `n` of its
//! channel as 0, 1, 2, … with nothing missing, repeated or out of order.
//! [`SubCheck`] classifies each arrival; [`Tally`] sums a period over all
//! subscriptions of a worker, and then over all workers.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::hist::{Histogram, WireHistogram};
use crate::protocol::ResumePoint;

/// Most gap entries remembered per subscription; a larger jump is counted
/// as lost at once (it cannot be a small reorder).
const MAX_SKIPPED: u64 = 100_000;
/// Error descriptions kept per report.
pub const MAX_ERRORS: usize = 8;

/// How one arrival compares with what the subscription expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    InOrder,
    /// Arrived after a later message: the ones in between are missing for now.
    Gap {
        skipped: u64,
    },
    /// One of the missing ones, arriving late.
    Reordered,
    /// Seen before.
    Duplicate,
    /// Sent again by the server because it was not acked in time (Herald's
    /// acked channels): expected behaviour, not a duplicate.
    Redelivered,
}

/// Ordering state of one subscription.
#[derive(Debug, Default)]
pub struct SubCheck {
    /// Next `n` expected.
    pub next_n: u64,
    /// `n`s skipped over and not seen since.
    skipped: BTreeSet<u64>,
    /// Lost at once because the jump was too large to track.
    untracked_lost: u64,
    /// Herald: seq of the last delivery and the log's epoch, to resume.
    pub resume: ResumePoint,
    /// Herald: deliveries whose seq did not follow the previous one.
    pub seq_errors: u64,
}

impl SubCheck {
    pub fn check(&mut self, n: u64, seq: Option<u64>) -> Outcome {
        if let Some(seq) = seq {
            match self.resume.last_seq {
                Some(last) if seq != last + 1 => self.seq_errors += 1,
                _ => {}
            }
            if self.resume.last_seq.is_none_or(|last| seq > last) {
                self.resume.last_seq = Some(seq);
            }
        }
        if n == self.next_n {
            self.next_n += 1;
            return Outcome::InOrder;
        }
        if n > self.next_n {
            let skipped = n - self.next_n;
            if skipped <= MAX_SKIPPED {
                self.skipped.extend(self.next_n..n);
            } else {
                self.untracked_lost += skipped;
            }
            self.next_n = n + 1;
            return Outcome::Gap { skipped };
        }
        if self.skipped.remove(&n) {
            Outcome::Reordered
        } else {
            Outcome::Duplicate
        }
    }

    /// A delivery the server marked as redelivered: already seen means
    /// [`Outcome::Redelivered`]; otherwise it is checked as any other.
    pub fn check_redelivery(&mut self, n: u64) -> Outcome {
        if n < self.next_n && !self.skipped.contains(&n) {
            Outcome::Redelivered
        } else {
            self.check(n, None)
        }
    }

    /// Close a period that expected every `n < target`: returns how many of
    /// them never arrived, and forgets them.
    pub fn settle(&mut self, target: u64) -> u64 {
        let missing_tail = target.saturating_sub(self.next_n);
        let lost = self.skipped.len() as u64 + self.untracked_lost + missing_tail;
        self.skipped.clear();
        self.untracked_lost = 0;
        self.next_n = self.next_n.max(target);
        lost
    }
}

/// Counts of one period (between two collects) of one worker, or summed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Tally {
    pub subscriptions: u64,
    /// Distinct expected messages that arrived (late ones included).
    pub delivered: u64,
    pub duplicates: u64,
    /// Herald acked channels: redeliveries of unacked messages (not errors).
    pub redeliveries: u64,
    pub reordered: u64,
    /// Expected and never arrived.
    pub lost: u64,
    /// Herald: seq did not follow the previous delivery's.
    pub seq_errors: u64,
    /// Connections the server (or the network) ended unexpectedly.
    pub disconnects: u64,
    /// Successful resumes after such an end.
    pub resumes: u64,
    /// Herald said `truncated` or `epoch_changed` on a resume.
    pub gaps_reported: u64,
    /// Subscriptions that did not receive everything by the deadline.
    pub incomplete: u64,
    pub first_rx_us: Option<u64>,
    pub last_rx_us: Option<u64>,
    pub latency: WireHistogram,
    pub errors: Vec<String>,
}

impl Tally {
    pub fn note_error(&mut self, e: String) {
        if self.errors.len() < MAX_ERRORS {
            self.errors.push(e);
        }
    }

    pub fn record(&mut self, outcome: Outcome, hist: &mut Histogram, latency_us: u64, now_us: u64) {
        match outcome {
            Outcome::InOrder | Outcome::Gap { .. } | Outcome::Reordered => {
                self.delivered += 1;
                hist.record(latency_us);
                self.first_rx_us.get_or_insert(now_us);
                self.last_rx_us = Some(now_us);
            }
            Outcome::Duplicate => self.duplicates += 1,
            Outcome::Redelivered => self.redeliveries += 1,
        }
        if outcome == Outcome::Reordered {
            self.reordered += 1;
        }
    }

    pub fn merge(&mut self, o: &Tally) {
        self.subscriptions += o.subscriptions;
        self.delivered += o.delivered;
        self.duplicates += o.duplicates;
        self.redeliveries += o.redeliveries;
        self.reordered += o.reordered;
        self.lost += o.lost;
        self.seq_errors += o.seq_errors;
        self.disconnects += o.disconnects;
        self.resumes += o.resumes;
        self.gaps_reported += o.gaps_reported;
        self.incomplete += o.incomplete;
        self.first_rx_us = min_opt(self.first_rx_us, o.first_rx_us);
        self.last_rx_us = self.last_rx_us.max(o.last_rx_us);
        let mut h = Histogram::from_wire(&self.latency);
        h.merge(&Histogram::from_wire(&o.latency));
        self.latency = h.to_wire();
        for e in &o.errors {
            self.note_error(e.clone());
        }
    }

    /// What went wrong, in words; empty when every delivery checked out.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        let mut say = |n: u64, what: &str| {
            if n > 0 {
                p.push(format!("{n} {what}"));
            }
        };
        say(self.lost, "messages LOST");
        say(self.duplicates, "DUPLICATE deliveries");
        say(self.reordered, "deliveries OUT OF ORDER");
        say(self.seq_errors, "seq discontinuities (Herald seq did not follow the previous one)");
        say(self.gaps_reported, "resumes reported truncated/epoch_changed");
        say(self.incomplete, "subscriptions incomplete at the deadline");
        p
    }
}

fn min_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_gaps_late_arrivals_and_duplicates() {
        let mut s = SubCheck::default();
        assert_eq!(s.check(0, None), Outcome::InOrder);
        assert_eq!(s.check(3, None), Outcome::Gap { skipped: 2 });
        assert_eq!(s.check(1, None), Outcome::Reordered);
        assert_eq!(s.check(1, None), Outcome::Duplicate);
        assert_eq!(s.check(3, None), Outcome::Duplicate);
        // 2 never came; 4 and 5 were expected too.
        assert_eq!(s.settle(6), 3);
        assert_eq!(s.next_n, 6);
        assert_eq!(s.check(6, None), Outcome::InOrder);
        assert_eq!(s.settle(7), 0);
        assert_eq!(s.check_redelivery(6), Outcome::Redelivered);
        assert_eq!(s.check_redelivery(7), Outcome::InOrder);
    }

    #[test]
    fn checks_herald_seq_continuity() {
        let mut s = SubCheck::default();
        s.resume.last_seq = Some(10);
        s.check(0, Some(11));
        s.check(1, Some(13));
        assert_eq!(s.seq_errors, 1);
        assert_eq!(s.resume.last_seq, Some(13));
        s.check(1, Some(12)); // a duplicate does not move the resume point back
        assert_eq!(s.resume.last_seq, Some(13));
    }

    #[test]
    fn merged_tallies_report_problems() {
        let mut a = Tally { subscriptions: 1, delivered: 5, ..Default::default() };
        let b = Tally { subscriptions: 1, lost: 2, first_rx_us: Some(7), ..Default::default() };
        a.merge(&b);
        assert_eq!((a.subscriptions, a.delivered, a.lost, a.first_rx_us), (2, 5, 2, Some(7)));
        assert_eq!(a.problems(), vec!["2 messages LOST".to_owned()]);
        assert!(Tally::default().problems().is_empty());
    }
}
