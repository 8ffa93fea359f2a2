//! Per-subscription resume position and dedup: pure logic, no IO.

use herald_proto::Since;

/// What a subscription has consumed of its channel's log.
///
/// Invariant: every seq `<= position` (in `epoch`) was delivered to the
/// caller or deliberately skipped with a reported reset; the next expected
/// seq is `position + 1`. `position` is `None` only before the first
/// subscribe reply of a subscription that started without `since`, and for
/// volatile channels (no log, no seq).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ResumePoint {
    position: Option<u64>,
    epoch: Option<String>,
}

/// What to do with an arriving message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// In order: deliver.
    Deliver,
    /// Already delivered (seq at or below the position): drop.
    Duplicate,
    /// Deliver, but seqs `expected..seq` were skipped without a reset: the
    /// caller must hear about it.
    Gap { expected: u64 },
}

/// The fields of a subscribe reply the resume point acts on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Subscribed<'a> {
    pub epoch: Option<&'a str>,
    pub first: Option<u64>,
    pub head: Option<u64>,
    pub truncated: bool,
    pub epoch_changed: bool,
}

/// Discontinuities a subscribe reply reported (or the resume point detected).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Reset {
    pub truncated: bool,
    pub epoch_changed: bool,
}

impl Reset {
    pub fn any(self) -> bool {
        self.truncated || self.epoch_changed
    }
}

impl ResumePoint {
    /// Start from a caller-supplied position (`since` = last seq the caller
    /// already has, and its epoch; an empty epoch means "unknown").
    pub fn new(since: Option<(u64, String)>) -> Self {
        match since {
            Some((seq, epoch)) => Self { position: Some(seq), epoch: (!epoch.is_empty()).then_some(epoch) },
            None => Self::default(),
        }
    }

    /// The `since` to send with a (re)subscribe.
    pub fn since(&self) -> Option<Since> {
        self.position.map(|seq| Since { seq, epoch: self.epoch.clone() })
    }

    /// Apply a subscribe reply. Returns the discontinuity, if any, which the
    /// caller must surface.
    ///
    /// - Volatile channel (no epoch in the reply): no log, forget positions.
    /// - Epoch changed (flagged by the server, or a different epoch than the
    ///   one we hold): the old seqs mean nothing; delivery restarts at
    ///   `first`.
    /// - Truncated: retention removed what we missed; delivery restarts at
    ///   `first`.
    /// - No position yet (subscribed without `since`): the server delivers
    ///   live messages after `head`, so `head` is our position. Resuming
    ///   from it after a disconnect loses nothing published meanwhile.
    pub fn on_subscribed(&mut self, reply: &Subscribed<'_>) -> Reset {
        let Some(epoch) = reply.epoch else {
            *self = Self::default();
            return Reset::default();
        };
        let epoch_changed = reply.epoch_changed || self.epoch.as_deref().is_some_and(|held| held != epoch);
        let first = reply.first.unwrap_or(1);
        if epoch_changed || reply.truncated {
            self.position = Some(first.saturating_sub(1));
        } else if self.position.is_none() {
            self.position = Some(reply.head.unwrap_or(0));
        }
        if self.epoch.as_deref() != Some(epoch) {
            self.epoch = Some(epoch.to_owned());
        }
        Reset { truncated: reply.truncated, epoch_changed }
    }

    /// Judge a message by its seq and advance the position when delivered.
    pub fn on_message(&mut self, seq: Option<u64>) -> Verdict {
        let Some(seq) = seq else {
            // Volatile: no order to keep, nothing to dedup.
            return Verdict::Deliver;
        };
        match self.position {
            Some(pos) if seq <= pos => Verdict::Duplicate,
            Some(pos) if seq == pos + 1 => {
                self.position = Some(seq);
                Verdict::Deliver
            }
            Some(pos) => {
                self.position = Some(seq);
                Verdict::Gap { expected: pos + 1 }
            }
            None => {
                self.position = Some(seq);
                Verdict::Deliver
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(epoch: &str, first: u64, head: u64) -> Subscribed<'_> {
        Subscribed { epoch: Some(epoch), first: Some(first), head: Some(head), ..Default::default() }
    }

    #[test]
    fn fresh_subscription_resumes_from_head_even_without_messages() {
        let mut c = ResumePoint::new(None);
        assert_eq!(c.since(), None);
        assert_eq!(c.on_subscribed(&reply("E", 1, 7)), Reset::default());
        assert_eq!(c.since(), Some(Since { seq: 7, epoch: Some("E".into()) }));
        assert_eq!(c.on_message(Some(8)), Verdict::Deliver);
        assert_eq!(c.since(), Some(Since { seq: 8, epoch: Some("E".into()) }));
    }

    #[test]
    fn drops_duplicates_at_and_below_the_position() {
        let mut c = ResumePoint::new(Some((3, "E".into())));
        c.on_subscribed(&reply("E", 1, 9));
        assert_eq!(c.on_message(Some(2)), Verdict::Duplicate);
        assert_eq!(c.on_message(Some(3)), Verdict::Duplicate);
        assert_eq!(c.on_message(Some(4)), Verdict::Deliver);
        assert_eq!(c.on_message(Some(4)), Verdict::Duplicate);
        assert_eq!(c.on_message(Some(5)), Verdict::Deliver);
        assert_eq!(c.since(), Some(Since { seq: 5, epoch: Some("E".into()) }));
    }

    #[test]
    fn reports_gaps_but_keeps_going() {
        let mut c = ResumePoint::new(Some((3, "E".into())));
        c.on_subscribed(&reply("E", 1, 9));
        assert_eq!(c.on_message(Some(6)), Verdict::Gap { expected: 4 });
        assert_eq!(c.on_message(Some(7)), Verdict::Deliver);
    }

    #[test]
    fn truncation_restarts_at_first_and_is_reported() {
        let mut c = ResumePoint::new(Some((3, "E".into())));
        let r = c.on_subscribed(&Subscribed { truncated: true, ..reply("E", 10, 20) });
        assert_eq!(r, Reset { truncated: true, epoch_changed: false });
        assert_eq!(c.on_message(Some(10)), Verdict::Deliver, "first retained seq is not a gap");
    }

    #[test]
    fn epoch_change_restarts_even_when_the_server_forgets_the_flag() {
        let mut c = ResumePoint::new(Some((50, "OLD".into())));
        let r = c.on_subscribed(&reply("NEW", 1, 3));
        assert!(r.epoch_changed && r.any());
        assert_eq!(c.since(), Some(Since { seq: 0, epoch: Some("NEW".into()) }));
        assert_eq!(c.on_message(Some(1)), Verdict::Deliver, "seq 1 of the new epoch is not a duplicate");
    }

    #[test]
    fn flagged_epoch_change_is_reported() {
        let mut c = ResumePoint::new(Some((5, String::new())));
        assert_eq!(c.since(), Some(Since { seq: 5, epoch: None }), "empty epoch is not sent");
        let r = c.on_subscribed(&Subscribed { epoch_changed: true, ..reply("E2", 2, 4) });
        assert_eq!(r, Reset { truncated: false, epoch_changed: true });
        assert_eq!(c.on_message(Some(2)), Verdict::Deliver);
    }

    #[test]
    fn volatile_channels_pass_everything_through() {
        let mut c = ResumePoint::new(None);
        assert_eq!(c.on_subscribed(&Subscribed::default()), Reset::default());
        assert_eq!(c.on_message(None), Verdict::Deliver);
        assert_eq!(c.on_message(None), Verdict::Deliver);
        assert_eq!(c.since(), None);
    }
}
