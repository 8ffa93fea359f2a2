//! Where a subscription starts: one resolution of `since`, epochs,
//! truncation and the acked cursor, for every protocol and consumer.

use herald_proto::Since;

use crate::engine::{Epoch, Position, Seq};
use crate::namespace::StartAt;

/// An acked subscription's stored state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckedStart {
    /// The subscriber's stored cursor, if it has one.
    pub stored: Option<Seq>,
    /// Where a subscriber without a cursor starts.
    pub start: StartAt,
}

/// A resolved start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    pub epoch: Epoch,
    /// The first seq to deliver.
    pub next: Seq,
    /// The oldest retained seq when resolved.
    pub first: Seq,
    /// The log's head when resolved.
    pub head: Seq,
    /// Retention removed messages the client asked for (or, acked, never
    /// acked): delivery starts at the oldest retained one.
    pub truncated: bool,
    /// Messages lost to that truncation.
    pub skipped: Seq,
    /// The client's `since` named another epoch (the log was reset).
    pub epoch_changed: bool,
    /// Acked: the stored cursor (0 without one).
    pub stored: Seq,
}

impl Start {
    /// Messages retained from `next` on.
    pub fn unread(&self) -> Seq {
        self.head.saturating_sub(self.next - 1)
    }
}

/// `since.seq` is past the channel's head (in its epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("since.seq {since} is beyond the channel head {head}")]
pub struct BeyondHead {
    pub since: Seq,
    pub head: Seq,
}

/// Resolve where a subscription starts, given the log's position, the
/// client's `since` and, for acked channels, the stored cursor.
///
/// - Durable: after `since.seq`, or at the head without one. A `since` of
///   another epoch starts at the oldest retained message (`epoch_changed`);
///   an empty epoch means "unknown" and trusts the seq. A seq older than
///   retention starts at the oldest retained message (`truncated`).
/// - Acked: after the larger of the stored cursor and `since.seq` (a `since`
///   of another epoch is ignored: the stored cursor belongs to this log);
///   without either, where `start` says.
pub fn resolve(
    pos: &Position,
    since: Option<&Since>,
    acked: Option<AckedStart>,
) -> Result<Start, BeyondHead> {
    let mut epoch_changed = false;
    let mut claimed = None;
    if let Some(since) = since {
        let epoch = since.epoch.as_deref().filter(|e| !e.is_empty());
        if epoch.is_some_and(|e| e != pos.epoch.as_str()) {
            epoch_changed = true;
        } else if since.seq > pos.head {
            return Err(BeyondHead { since: since.seq, head: pos.head });
        } else {
            claimed = Some(since.seq);
        }
    }
    let (has, stored) = match acked {
        Some(a) => {
            let has = match (a.stored, claimed) {
                (Some(c), Some(s)) => Some(c.max(s)),
                (c, s) => c.or(s),
            };
            let has = has.unwrap_or(match a.start {
                StartAt::Oldest => pos.first - 1,
                StartAt::Head => pos.head,
            });
            (has, a.stored.unwrap_or(0))
        }
        None if epoch_changed => (pos.first - 1, 0),
        None => (claimed.unwrap_or(pos.head), 0),
    };
    let truncated = has + 1 < pos.first;
    Ok(Start {
        epoch: pos.epoch.clone(),
        next: (has + 1).max(pos.first),
        first: pos.first,
        head: pos.head,
        truncated,
        skipped: if truncated { pos.first - 1 - has } else { 0 },
        epoch_changed,
        stored,
    })
}
