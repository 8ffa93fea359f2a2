//! Presence: members of a channel as leases with fencing tokens.
//!
//! A member is a lease `{member, token, expires_at_ms}` stored by the engine
//! under the member's [`key`](member_key) (user + client id). Invariants every
//! engine keeps:
//! - **fencing**: each [`Presence::lease_join`](crate::Presence::lease_join)
//!   gives the lease a token greater than every token the channel handed out
//!   before (monotonic per channel, so per member too). Renew and leave carry
//!   the token they were given and have no effect unless it is the stored
//!   one: a paused node that wakes up cannot extend, remove or resurrect a
//!   lease that was taken over or swept meanwhile;
//! - **no resurrection**: renew never creates a lease; join does, and
//!   [`rejoin`](crate::Presence::lease_rejoin) re-creates a removed lease
//!   only for the holder of its token, and only while the engine can tell
//!   that nothing newer happened to the member: no later token was handed
//!   to it and its holder did not leave (see [`Rejoined`]);
//! - **exactly one leave**: a lease is removed by exactly one successful
//!   leave or expiry sweep, so exactly one node announces the member's
//!   `leave`;
//! - **expiry**: a lease with `expires_at_ms <= now` is not listed or
//!   counted, even before a sweep removes it.

use std::time::Duration;

pub use herald_proto::Member;

/// Orders writes to one member's lease; see the module docs.
pub type FenceToken = u64;

/// How long an engine at least remembers that a member's lease was removed
/// (by a leave or a sweep), and with which token: the window in which a
/// late [`lease_rejoin`](crate::Presence::lease_rejoin) is still told
/// apart from a legitimate one. Rejoins come within a renewal period or two
/// of the removal (the holder must first show it is alive); this is far
/// beyond that.
pub const GONE_MEMORY: Duration = Duration::from_secs(300);
/// At most this many removals are remembered per channel; past it the
/// oldest are forgotten first (before [`GONE_MEMORY`] is over).
pub const GONE_CAP: usize = 4096;

/// The storage key of a member within its channel: `{len(user)}:{user}`
/// followed by the client id. Unique per (user, client id) and never shared
/// across users, so a client cannot take over another user's member by
/// naming its client id.
pub fn member_key(member: &Member) -> String {
    format!("{}:{}{}", member.user.len(), member.user, member.client_id)
}

/// A member's lease.
#[derive(Debug, Clone, PartialEq)]
pub struct Lease {
    pub member: Member,
    pub token: FenceToken,
    /// Server time (ms since the Unix epoch) from which the lease counts as
    /// gone.
    pub expires_at_ms: u64,
}

impl Lease {
    pub fn key(&self) -> String {
        member_key(&self.member)
    }
}

/// The result of a join.
#[derive(Debug, Clone, PartialEq)]
pub enum Joined {
    /// The member was not present: announce a `join`.
    New(Lease),
    /// A lease with this key existed (a client back within its lease, maybe
    /// through another node): it now has a new token and expiry, and the
    /// old holder's token is fenced off. Nothing to announce.
    Reclaimed(Lease),
}

impl Joined {
    pub fn lease(&self) -> &Lease {
        match self {
            Joined::New(l) | Joined::Reclaimed(l) => l,
        }
    }
}

/// The result of a renew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewed {
    /// Extended until this time (ms since the Unix epoch).
    Until(u64),
    /// A later join holds the member (a newer token): this holder is no
    /// longer the member and must not rejoin.
    Superseded,
    /// The lease is gone (expired and swept, or left): its `leave` was
    /// announced. A holder still connected may ask for it back with
    /// [`lease_rejoin`](crate::Presence::lease_rejoin) (announcing a
    /// `join`).
    Gone,
}

/// The result of a rejoin: a holder whose renew found its lease
/// [`Renewed::Gone`] asks for it back with its token.
#[derive(Debug, Clone, PartialEq)]
pub enum Rejoined {
    /// The lease is back, with the caller's token and a fresh expiry: the
    /// member had left (its `leave` was announced), so announce a `join`.
    Back(Lease),
    /// The lease was still stored with the caller's token: extended until
    /// this time (ms since the Unix epoch). Nothing to announce.
    Held(u64),
    /// Refused, nothing changed: the member is held by a later token, or
    /// was held by one since the caller's, or the caller's token left. The
    /// caller no longer holds the member and must not try again.
    Fenced,
}
