//! The room lifecycle: a state machine over a versioned record.
//!
//! ```text
//!   open ──host present──▶ live ──host lease lost──▶ grace ──grace over──▶ closed
//!    │                      ▲                          │
//!    │                      └──────host back───────────┘
//!    └──────────────(API: DELETE or PATCH state=closed, from any state)──▶ closed
//! ```
//!
//! `closed` is final. Every change (state or attributes) increments
//! `version` by one. Engines store the record and change it only by
//! compare-and-set on `version` ([`Rooms::room_write`](crate::Rooms::room_write)),
//! together with the room event appended to the room's log, so the log holds
//! exactly one event per version, in version order. The transitions
//! themselves are decided here, once, for every engine.

use serde::{Deserialize, Serialize};

/// A room's state: a wire value, defined with the API bodies in
/// `herald-proto`; the transitions are decided here.
pub use herald_proto::RoomStatus;

/// A room's record, as stored by the engine (JSON, so engines need no codec
/// of their own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Room {
    pub state: RoomStatus,
    /// 1 at creation; +1 per change.
    pub version: u64,
    /// The host's user id (a token `sub`).
    pub host: String,
    /// App-defined JSON object.
    pub attributes: serde_json::Map<String, serde_json::Value>,
    /// How long the room waits in `grace` for its host.
    pub grace_period_ms: u64,
    /// Set while in `grace`: when the room closes (ms since the Unix epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_until_ms: Option<u64>,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    /// Users removed from the room, in removal order: their subscribes to
    /// the room's channel are refused for the room's life. At most
    /// [`Room::MAX_REMOVED`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
}

/// Why a change was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a room cannot go from {from} to {to}")]
pub struct IllegalTransition {
    pub from: RoomStatus,
    pub to: RoomStatus,
}

/// Why the room changed: recorded in its event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoomReason {
    Created,
    HostJoined,
    HostLeft,
    GraceExpired,
    /// Changed through the API.
    Api,
    /// A member was removed through the API.
    MemberRemoved,
}

impl Room {
    /// A new room, `open`, version 1.
    pub fn new(
        host: String,
        attributes: serde_json::Map<String, serde_json::Value>,
        grace_period_ms: u64,
        now_ms: u64,
    ) -> Self {
        Room {
            state: RoomStatus::Open,
            version: 1,
            host,
            attributes,
            grace_period_ms,
            grace_until_ms: None,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            removed: Vec::new(),
        }
    }

    /// Most users a room records as removed.
    pub const MAX_REMOVED: usize = 1000;

    /// Whether `user` was removed from the room.
    pub fn is_removed(&self, user: &str) -> bool {
        self.removed.iter().any(|u| u == user)
    }

    /// The next version of this room with `user` removed; `None` if it is
    /// already (nothing to write).
    pub fn remove_member(&self, user: &str, now_ms: u64) -> Option<Room> {
        if self.is_removed(user) {
            return None;
        }
        let mut next = self.clone();
        next.removed.push(user.to_owned());
        next.version = self.version + 1;
        next.updated_at_ms = now_ms;
        Some(next)
    }

    /// The next version of this room with state `to` (and new attributes if
    /// given). Entering `grace` starts the grace period; leaving it clears
    /// it.
    pub fn change(
        &self,
        to: Option<RoomStatus>,
        attributes: Option<serde_json::Map<String, serde_json::Value>>,
        now_ms: u64,
    ) -> Result<Room, IllegalTransition> {
        let to_state = to.unwrap_or(self.state);
        if !self.state.can_become(to_state) {
            return Err(IllegalTransition { from: self.state, to: to_state });
        }
        let mut next = self.clone();
        next.state = to_state;
        next.version = self.version + 1;
        next.updated_at_ms = now_ms;
        if let Some(a) = attributes {
            next.attributes = a;
        }
        next.grace_until_ms = match (self.state, to_state) {
            (RoomStatus::Grace, RoomStatus::Grace) => self.grace_until_ms,
            (_, RoomStatus::Grace) => Some(now_ms.saturating_add(self.grace_period_ms)),
            _ => None,
        };
        Ok(next)
    }

    /// The automatic transition due now, given whether the host holds a
    /// lease on the room's channel: `open`/`grace` → `live` when the host is
    /// present, `live` → `grace` when not, `grace` → `closed` when the grace
    /// period is over. `None` when the room is where it should be.
    pub fn due(&self, host_present: bool, now_ms: u64) -> Option<(RoomStatus, RoomReason)> {
        match self.state {
            RoomStatus::Open | RoomStatus::Grace if host_present => {
                Some((RoomStatus::Live, RoomReason::HostJoined))
            }
            RoomStatus::Live if !host_present => Some((RoomStatus::Grace, RoomReason::HostLeft)),
            RoomStatus::Grace if self.grace_until_ms.is_some_and(|t| now_ms >= t) => {
                Some((RoomStatus::Closed, RoomReason::GraceExpired))
            }
            _ => None,
        }
    }

    /// The body of this version's room event (the `data` of its
    /// `{"type":"room"}` frame).
    pub fn event(&self, reason: RoomReason) -> serde_json::Value {
        serde_json::json!({
            "state": self.state,
            "version": self.version,
            "host": self.host,
            "attributes": self.attributes,
            "grace_until_ms": self.grace_until_ms,
            "reason": reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RoomStatus::*;

    fn room() -> Room {
        Room::new("alice".into(), Default::default(), 1_000, 10)
    }

    #[test]
    fn transitions_follow_the_lifecycle() {
        let all = [Open, Live, Grace, Closed];
        let legal = [
            (Open, Open),
            (Open, Live),
            (Open, Closed),
            (Live, Live),
            (Live, Grace),
            (Live, Closed),
            (Grace, Grace),
            (Grace, Live),
            (Grace, Closed),
        ];
        for from in all {
            for to in all {
                assert_eq!(from.can_become(to), legal.contains(&(from, to)), "{from} -> {to}");
            }
        }
    }

    #[test]
    fn every_change_bumps_the_version_and_grace_has_a_deadline() {
        let r = room();
        let live = r.change(Some(Live), None, 20).unwrap();
        assert_eq!((live.version, live.grace_until_ms), (2, None));
        let grace = live.change(Some(Grace), None, 30).unwrap();
        assert_eq!((grace.version, grace.grace_until_ms), (3, Some(1_030)));
        let attrs = grace.change(None, Some(serde_json::Map::new()), 40).unwrap();
        assert_eq!((attrs.state, attrs.version, attrs.grace_until_ms), (Grace, 4, Some(1_030)));
        let back = attrs.change(Some(Live), None, 50).unwrap();
        assert_eq!(back.grace_until_ms, None);
        let closed = back.change(Some(Closed), None, 60).unwrap();
        assert_eq!(closed.change(None, None, 70), Err(IllegalTransition { from: Closed, to: Closed }));
        assert!(r.change(Some(Grace), None, 20).is_err(), "open -> grace is illegal");
    }

    #[test]
    fn due_transitions_follow_host_presence_and_the_clock() {
        let r = room();
        assert_eq!(r.due(false, 0), None);
        assert_eq!(r.due(true, 0), Some((Live, RoomReason::HostJoined)));
        let live = r.change(Some(Live), None, 0).unwrap();
        assert_eq!(live.due(true, 0), None);
        assert_eq!(live.due(false, 0), Some((Grace, RoomReason::HostLeft)));
        let grace = live.change(Some(Grace), None, 100).unwrap();
        assert_eq!(grace.due(false, 1_099), None);
        assert_eq!(grace.due(false, 1_100), Some((Closed, RoomReason::GraceExpired)));
        assert_eq!(grace.due(true, 5_000), Some((Live, RoomReason::HostJoined)), "the host wins the race");
    }
}
