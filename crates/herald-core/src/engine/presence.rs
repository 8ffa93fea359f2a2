//! Presence: members of a channel as leases with fencing tokens (the
//! invariants are in [`crate::presence`]).
//!
//! The four lease writes are requests ([`LeaseJoin`], [`LeaseRenew`],
//! [`LeaseLeave`], [`LeaseRejoin`]), like [`AppendRequest`](super::AppendRequest)
//! and [`RoomWrite`](super::RoomWrite): an engine implements the
//! `lease_*` method that takes the owned request (the embedded engine
//! queues it to its writer as it is), and callers use the `presence_*`
//! form, which borrows and is written here once.

use std::time::Duration;

use async_trait::async_trait;
use herald_proto::ChannelName;

use super::EngineError;
use crate::presence::{FenceToken, Joined, Lease, Member, Rejoined, Renewed};

/// A join: see [`Presence::lease_join`].
#[derive(Debug, Clone)]
pub struct LeaseJoin {
    pub channel: ChannelName,
    pub member: Member,
    pub ttl: Duration,
}

/// A renewal of the lease `key` held with `token`: see
/// [`Presence::lease_renew`].
#[derive(Debug, Clone)]
pub struct LeaseRenew {
    pub channel: ChannelName,
    /// The member key ([`member_key`](crate::member_key)).
    pub key: String,
    pub token: FenceToken,
    pub ttl: Duration,
}

/// A leave of the lease `key` held with `token`: see
/// [`Presence::lease_leave`].
#[derive(Debug, Clone)]
pub struct LeaseLeave {
    pub channel: ChannelName,
    /// The member key ([`member_key`](crate::member_key)).
    pub key: String,
    pub token: FenceToken,
}

/// A rejoin of `member` with the `token` it held: see
/// [`Presence::lease_rejoin`].
#[derive(Debug, Clone)]
pub struct LeaseRejoin {
    pub channel: ChannelName,
    pub member: Member,
    pub token: FenceToken,
    pub ttl: Duration,
}

/// Presence leases (see [`crate::presence`] for the invariants every engine
/// keeps: fencing, no resurrection, exactly one leave, expiry).
#[async_trait]
pub trait Presence: Send + Sync + 'static {
    /// Make `member` present on `channel` until now + `ttl`, with a new
    /// fencing token. A stored lease with the same key (expired or not, as
    /// long as no sweep removed it) is taken over: [`Joined::Reclaimed`].
    /// A closed channel (a closed room) takes no members:
    /// [`EngineError::Closed`].
    ///
    /// Durability of presence writes (join, renew, leave, expire): like an
    /// ack — no fsync of their own; `Ok` survives a crash of the Herald
    /// process.
    async fn lease_join(&self, join: LeaseJoin) -> Result<Joined, EngineError>;

    /// Extend the lease `key` to now + `ttl` if its token is `token`. Never
    /// creates a lease; a lease that expired but was not swept yet is
    /// extended (no `leave` was announced for it, so the member never left).
    async fn lease_renew(&self, renew: LeaseRenew) -> Result<Renewed, EngineError>;

    /// Remove the lease `key` if its token is `token`; returns it when
    /// removed (the caller announces the `leave`). Either way the holder of
    /// `token` is done: a later [`lease_rejoin`](Presence::lease_rejoin)
    /// with `token` is [`Rejoined::Fenced`] (a clean close removes whatever
    /// lease of its token exists, including one a rejoin re-created, and no
    /// rejoin still in flight can bring it back).
    async fn lease_leave(&self, leave: LeaseLeave) -> Result<Option<Lease>, EngineError>;

    /// Bring back the lease of `member` that its holder held with `token`,
    /// after a renew found it [`Renewed::Gone`] (it expired and was swept
    /// while the holder could not renew) and the holder showed it is alive.
    /// The rejoin carries the fencing token, so a late one loses; in one
    /// atomic step:
    /// - the lease is stored with `token`: extended, [`Rejoined::Held`];
    /// - the lease is stored with another token (a later join): nothing
    ///   changes, [`Rejoined::Fenced`] (a rejoin never takes a member over);
    /// - no lease, and the engine remembers the member's last removal
    ///   ([`GONE_MEMORY`](crate::GONE_MEMORY)) as a leave with `token`, or
    ///   as the removal of a greater token: [`Rejoined::Fenced`];
    /// - otherwise the lease is created again with `token` (not a new one:
    ///   a leave with `token` still removes it) until now + `ttl`,
    ///   [`Rejoined::Back`]: announce a `join`.
    ///
    /// A closed channel (a closed room): [`EngineError::Closed`].
    async fn lease_rejoin(&self, rejoin: LeaseRejoin) -> Result<Rejoined, EngineError>;

    /// [`lease_join`](Presence::lease_join) from borrowed parts.
    async fn presence_join(
        &self,
        channel: &ChannelName,
        member: &Member,
        ttl: Duration,
    ) -> Result<Joined, EngineError> {
        self.lease_join(LeaseJoin { channel: channel.clone(), member: member.clone(), ttl }).await
    }

    /// [`lease_renew`](Presence::lease_renew) from borrowed parts.
    async fn presence_renew(
        &self,
        channel: &ChannelName,
        key: &str,
        token: FenceToken,
        ttl: Duration,
    ) -> Result<Renewed, EngineError> {
        self.lease_renew(LeaseRenew { channel: channel.clone(), key: key.to_owned(), token, ttl }).await
    }

    /// [`lease_leave`](Presence::lease_leave) from borrowed parts.
    async fn presence_leave(
        &self,
        channel: &ChannelName,
        key: &str,
        token: FenceToken,
    ) -> Result<Option<Lease>, EngineError> {
        self.lease_leave(LeaseLeave { channel: channel.clone(), key: key.to_owned(), token }).await
    }

    /// [`lease_rejoin`](Presence::lease_rejoin) from borrowed parts.
    async fn presence_rejoin(
        &self,
        channel: &ChannelName,
        member: &Member,
        token: FenceToken,
        ttl: Duration,
    ) -> Result<Rejoined, EngineError> {
        self.lease_rejoin(LeaseRejoin { channel: channel.clone(), member: member.clone(), token, ttl }).await
    }

    /// Up to `limit` unexpired leases of `channel`, ordered by key.
    async fn presence(&self, channel: &ChannelName, limit: usize) -> Result<Vec<Lease>, EngineError>;

    /// How many unexpired leases `channel` has.
    async fn presence_count(&self, channel: &ChannelName) -> Result<u64, EngineError>;

    /// Whether `user` holds an unexpired lease on `channel` (any client id).
    async fn presence_has_user(&self, channel: &ChannelName, user: &str) -> Result<bool, EngineError>;

    /// Remove up to `limit` leases (of any channel) that expired, and return
    /// them. Each removal is remembered (see
    /// [`lease_rejoin`](Presence::lease_rejoin)): its holder may ask for
    /// it back. Each removed lease is returned to at most one caller, on any
    /// node, which announces its `leave`: exactly one unless the reply is
    /// lost (the caller gave up, a Redis reply timed out), in which case the
    /// lease is gone without a `leave` frame — presence listings stay right,
    /// only the live event is missing.
    async fn presence_expire(&self, limit: usize) -> Result<Vec<(ChannelName, Lease)>, EngineError>;
}
