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
    /// Herald: highest seq delivered.
    pub delivered_seq: Option<u64>,
    /// Herald acked channels: highest seq acked, and when (µs).
    pub acked: Option<(u64, u64)>,
    /// Wall clock (µs) of the first subscribe request.
    pub first_subscribe_us: Option<u64>,
    /// The subscribe → last ack span was reported (once per subscription).
    drain_reported: bool,
}

impl SubCheck {
    pub fn check(&mut self, n: u64, seq: Option<u64>) -> Outcome {
        if let Some(seq) = seq {
            self.delivered_seq = self.delivered_seq.max(Some(seq));
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
    pub fn check_redelivery(&mut self, n: u64, seq: Option<u64>) -> Outcome {
        if n < self.next_n && !self.skipped.contains(&n) {
            Outcome::Redelivered
        } else {
            self.check(n, seq)
        }
    }

    /// The first subscribe went out at `at_us`; later ones (resumes) do
    /// not move it.
    pub fn subscribed(&mut self, at_us: u64) {
        self.first_subscribe_us.get_or_insert(at_us);
    }

    /// An ack up to `seq` was sent at `at_us` (acks are cumulative).
    pub fn on_ack(&mut self, seq: u64, at_us: u64) {
        if self.acked.is_none_or(|(s, _)| seq > s) {
            self.acked = Some((seq, at_us));
        }
    }

    /// Every seq delivered so far has been acked (trivially, if none was).
    pub fn acks_cover_deliveries(&self) -> bool {
        match (self.delivered_seq, self.acked) {
            (None, _) => true,
            (Some(d), Some((a, _))) => a >= d,
            (Some(_), None) => false,
        }
    }

    /// Time from the first subscribe to the last ack, in µs, once per
    /// subscription and only when its acks cover what it was delivered: how
    /// long draining its inbox took.
    pub fn take_drain_span(&mut self) -> Option<(u64, u64)> {
        if self.drain_reported || !self.acks_cover_deliveries() {
            return None;
        }
        let (start, (_, end)) = (self.first_subscribe_us?, self.acked?);
        self.drain_reported = true;
        Some((start, end.saturating_sub(start)))
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
    /// Successful resumes after such an end, and when the last one was
    /// subscribed again (wall clock, µs).
    pub resumes: u64,
    #[serde(default)]
    pub last_resume_us: Option<u64>,
    /// Herald said `truncated` or `epoch_changed` on a resume.
    pub gaps_reported: u64,
    /// Subscriptions that did not receive everything by the deadline.
    pub incomplete: u64,
    pub first_rx_us: Option<u64>,
    pub last_rx_us: Option<u64>,
    pub latency: WireHistogram,
    /// Herald acked channels: ack frames sent, and when the last one went.
    pub acks_sent: u64,
    pub last_ack_us: Option<u64>,
    /// Sum of `unread` in the replies to first subscribes (the offline
    /// inboxes the server said it would deliver).
    pub unread_at_subscribe: u64,
    /// Collects that waited for acks: subscriptions whose acks did not
    /// cover their deliveries by the deadline.
    pub unacked: u64,
    /// Each subscription's first subscribe → the ack covering its inbox
    /// (µs), and the earliest of those subscribes.
    pub drain: WireHistogram,
    pub first_subscribe_us: Option<u64>,
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

    pub fn record_ack(&mut self, now_us: u64) {
        self.acks_sent += 1;
        self.last_ack_us = self.last_ack_us.max(Some(now_us));
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
        self.last_resume_us = self.last_resume_us.max(o.last_resume_us);
        self.gaps_reported += o.gaps_reported;
        self.incomplete += o.incomplete;
        self.first_rx_us = min_opt(self.first_rx_us, o.first_rx_us);
        self.last_rx_us = self.last_rx_us.max(o.last_rx_us);
        self.latency = merge_wire(&self.latency, &o.latency);
        self.acks_sent += o.acks_sent;
        self.last_ack_us = self.last_ack_us.max(o.last_ack_us);
        self.unread_at_subscribe += o.unread_at_subscribe;
        self.unacked += o.unacked;
        self.drain = merge_wire(&self.drain, &o.drain);
        self.first_subscribe_us = min_opt(self.first_subscribe_us, o.first_subscribe_us);
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
        say(self.unacked, "subscriptions with deliveries still unacked at the deadline");
        p
    }
}

fn merge_wire(a: &WireHistogram, b: &WireHistogram) -> WireHistogram {
    let mut h = Histogram::from_wire(a);
    h.merge(&Histogram::from_wire(b));
    h.to_wire()
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
        assert_eq!(s.check_redelivery(6, None), Outcome::Redelivered);
        assert_eq!(s.check_redelivery(7, None), Outcome::InOrder);
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
    fn drain_span_runs_from_first_subscribe_to_the_covering_ack() {
        let mut s = SubCheck::default();
        assert!(s.acks_cover_deliveries(), "nothing delivered, nothing to ack");
        s.subscribed(1_000);
        s.subscribed(5_000); // a resume does not move the start
        s.resume.last_seq = Some(0);
        for (n, seq) in (0..3).zip(1..) {
            assert_eq!(s.check(n, Some(seq)), Outcome::InOrder);
        }
        assert!(!s.acks_cover_deliveries());
        assert_eq!(s.take_drain_span(), None);
        s.on_ack(2, 2_000);
        assert_eq!(s.take_drain_span(), None, "seq 3 is not acked yet");
        s.on_ack(3, 3_500);
        s.on_ack(1, 9_000); // acks are cumulative: an older one changes nothing
        assert_eq!(s.acked, Some((3, 3_500)));
        assert!(s.acks_cover_deliveries());
        assert_eq!(s.take_drain_span(), Some((1_000, 2_500)));
        assert_eq!(s.take_drain_span(), None, "reported once");
        // A redelivery of a seen message is not new, but keeps its seq.
        assert_eq!(s.check_redelivery(2, Some(3)), Outcome::Redelivered);
        assert_eq!(s.delivered_seq, Some(3));
    }

    #[test]
    fn merged_tallies_report_problems() {
        let mut a = Tally { subscriptions: 1, delivered: 5, ..Default::default() };
        let b = Tally { subscriptions: 1, lost: 2, first_rx_us: Some(7), ..Default::default() };
        a.merge(&b);
        assert_eq!((a.subscriptions, a.delivered, a.lost, a.first_rx_us), (2, 5, 2, Some(7)));
        assert_eq!(a.problems(), vec!["2 messages LOST".to_owned()]);
        assert!(Tally::default().problems().is_empty());
        let mut acks = Tally::default();
        acks.record_ack(10);
        acks.record_ack(30);
        let mut other = Tally { unacked: 1, unread_at_subscribe: 4, ..Default::default() };
        other.record_ack(20);
        acks.merge(&other);
        assert_eq!((acks.acks_sent, acks.last_ack_us, acks.unread_at_subscribe), (3, Some(30), 4));
        assert_eq!(acks.problems().len(), 1);
    }
}
