//! Presence announcements and the room lifecycle, on top of the engine.
//!
//! The engine holds the truth (leases with fencing tokens, room records
//! changed by compare-and-set together with their log event); this module
//! decides what to announce and which room transition is due. The keeper
//! that drives the timers is `jobs::room_keeper`; every transition it
//! makes goes through [`check_room`], as do the event-driven checks (a host
//! joins or leaves), which only make the same transitions sooner.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use herald_core::{
    AppendRequest, EngineError, Joined, Member, NamespaceOptions, Rejoined, Room, RoomReason, RoomStatus,
    RoomWrite, RoomWritten,
};
use herald_proto::{ChannelName, ErrorCode, FrameKind};
use serde_json::value::RawValue;

use crate::error::ApiError;
use crate::state::AppState;

/// Compare-and-set retries of one automatic transition before the keeper
/// leaves it to its next pass.
const CAS_RETRIES: usize = 3;

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

pub fn no_such_room() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such room; create it with PUT /api/v1/rooms/{room}")
}

/// Every room channel among `targets` exists (a publish to a room that was
/// never created is refused before anything is stored).
pub async fn require_rooms(
    state: &AppState,
    targets: &[(ChannelName, &NamespaceOptions)],
) -> Result<(), ApiError> {
    for (channel, ns) in targets {
        if ns.room && state.engine.room(channel).await?.is_none() {
            return Err(no_such_room());
        }
    }
    Ok(())
}

/// A connection's hold on its member lease of one channel.
#[derive(Debug, Clone)]
pub struct MemberLease {
    pub member: Member,
    pub key: String,
    pub token: herald_core::FenceToken,
    /// The lease was found gone (it expired while this connection could
    /// not renew it): the liveness mark after which the peer must answer a
    /// ping before the lease is asked back (see `session/liveness.rs`).
    pub lapsed: Option<u64>,
}

/// The member count and (unless `count_only`) up to `limit` members of a
/// presence channel. A room channel must exist.
pub async fn list(
    state: &AppState,
    ns: &NamespaceOptions,
    channel: &ChannelName,
    count_only: bool,
    limit: usize,
) -> Result<(u64, Option<Vec<Member>>), ApiError> {
    if ns.room && state.engine.room(channel).await?.is_none() {
        return Err(no_such_room());
    }
    if count_only {
        return Ok((state.engine.presence_count(channel).await?, None));
    }
    let (count, members) = members(state, channel, limit).await?;
    Ok((count, Some(members)))
}

/// The member count and up to `limit` members. A listing shorter than
/// `limit` is the whole membership, so only a truncated one costs a count.
pub async fn members(
    state: &AppState,
    channel: &ChannelName,
    limit: usize,
) -> Result<(u64, Vec<Member>), EngineError> {
    let leases = state.engine.presence(channel, limit).await?;
    let count = match leases.len() {
        n if n < limit => n as u64,
        _ => state.engine.presence_count(channel).await?,
    };
    Ok((count, leases.into_iter().map(|l| l.member).collect()))
}

/// Join `member` to `channel`; announces `join` for a new member and lets a
/// room see its host.
pub async fn join(
    state: &Arc<AppState>,
    channel: &ChannelName,
    member: Member,
) -> Result<MemberLease, EngineError> {
    let joined =
        state.engine.presence_join(channel, &member, state.config().presence.member_lease_ttl).await?;
    let lease = joined.lease();
    let hold =
        MemberLease { key: lease.key(), token: lease.token, member: lease.member.clone(), lapsed: None };
    if let Joined::New(_) = &joined {
        state.metrics.presence_joins.inc();
        announce(state, channel, FrameKind::Join, &hold.member).await;
    }
    member_changed(state, channel, &hold.member.user).await;
    Ok(hold)
}

/// Ask back the lease of `hold`, found gone, for a connection that just
/// showed it is alive. The engine decides with the hold's token (a late
/// rejoin loses, see `Engine::presence_rejoin`); a lease that comes back
/// is announced as a `join` (its `leave` was). `Ok(false)`: the hold is
/// fenced off for good.
pub async fn rejoin(
    state: &Arc<AppState>,
    channel: &ChannelName,
    hold: &MemberLease,
) -> Result<bool, EngineError> {
    let ttl = state.config().presence.member_lease_ttl;
    match state.engine.presence_rejoin(channel, &hold.member, hold.token, ttl).await? {
        Rejoined::Back(lease) => {
            state.metrics.presence_joins.inc();
            announce(state, channel, FrameKind::Join, &lease.member).await;
            member_changed(state, channel, &lease.member.user).await;
            Ok(true)
        }
        Rejoined::Held(_) => Ok(true),
        Rejoined::Fenced => Ok(false),
    }
}

/// End `hold` cleanly: removes the lease if it is still ours and announces
/// the `leave`. Also for a lapsed hold: the leave then removes nothing but
/// fences off any rejoin of its token still in flight.
pub async fn leave(state: &Arc<AppState>, channel: &ChannelName, hold: &MemberLease) {
    match state.engine.presence_leave(channel, &hold.key, hold.token).await {
        Ok(Some(lease)) => {
            state.metrics.presence_leaves.inc();
            announce(state, channel, FrameKind::Leave, &lease.member).await;
            member_changed(state, channel, &lease.member.user).await;
        }
        Ok(None) => {} // taken over or swept meanwhile: someone else announced it
        Err(e) => {
            // The lease expires by itself; its leave is announced then.
            tracing::warn!(channel = %channel, error = %e, "presence leave failed; the lease will expire");
        }
    }
}

/// Push a `join` or `leave` to the channel's subscribers on every node. Live
/// only: a subscriber that misses one re-lists presence.
pub(crate) async fn announce(state: &AppState, channel: &ChannelName, kind: FrameKind, member: &Member) {
    let body = serde_json::to_string(member).expect("members serialise");
    let body = RawValue::from_string(body).expect("serde_json output is valid JSON");
    let req = AppendRequest {
        kind,
        ..AppendRequest::message(
            channel.clone(),
            body,
            false,
            herald_core::Retention { max_len: 0, max_age: None },
        )
    };
    match state.engine.append(req).await {
        Ok(_) | Err(EngineError::Closed) => {}
        Err(e) => tracing::warn!(channel = %channel, error = %e, "presence announcement failed"),
    }
}

/// End every lease of `user` on `channel` (among the first
/// `presence.max_members_listed` members listed; the user's sessions end
/// theirs too when they take the unsubscribe), each with its `leave`.
/// Returns how many this call ended.
pub async fn remove_user(state: &AppState, channel: &ChannelName, user: &str) -> Result<usize, EngineError> {
    let leases = state.engine.presence(channel, state.config().presence.max_members_listed).await?;
    let mut ended = 0;
    for lease in leases.into_iter().filter(|l| l.member.user == user) {
        if let Some(gone) = state.engine.presence_leave(channel, &lease.key(), lease.token).await? {
            state.metrics.presence_leaves.inc();
            announce(state, channel, FrameKind::Leave, &gone.member).await;
            ended += 1;
        }
    }
    if ended > 0 {
        member_changed(state, channel, user).await;
    }
    Ok(ended)
}

/// A member of `user` joined or left `channel`. Only the host's presence
/// moves a room, so only then is its state checked now (one room read for
/// everyone else); the keeper's pass would make the same transition later.
pub(crate) async fn member_changed(state: &AppState, channel: &ChannelName, user: &str) {
    if !state.config().namespaces.resolve(channel).is_ok_and(|ns| ns.room) {
        return;
    }
    match state.engine.room(channel).await {
        Ok(Some(room)) if room.host == user => check_room(state, channel).await,
        Ok(_) => {}
        Err(e) => tracing::warn!(room = %channel, error = %e, "room read failed; the keeper retries"),
    }
}

/// Write the next version of a room together with its event.
pub async fn write_room(
    state: &AppState,
    ns: &NamespaceOptions,
    channel: &ChannelName,
    expected_version: Option<u64>,
    room: Room,
    reason: RoomReason,
) -> Result<RoomWritten, EngineError> {
    let body =
        RawValue::from_string(room.event(reason).to_string()).expect("serde_json output is valid JSON");
    let closes = room.state == RoomStatus::Closed;
    let event = AppendRequest {
        kind: FrameKind::Room,
        closes,
        ..AppendRequest::message(channel.clone(), body, true, ns.retention())
    };
    state.webhooks.ensure(&*state.engine, ns, channel).await?;
    let written = state.engine.room_write(RoomWrite { expected_version, room, event }).await?;
    if let RoomWritten::Written { .. } = &written {
        state.webhooks.appended(channel);
    }
    if let RoomWritten::Written { room, .. } = &written {
        state.metrics.room_changes.inc();
        tracing::info!(room = %channel, state = %room.state, version = room.version, ?reason, "room changed");
        if closes {
            cancel_channel(state, channel).await;
        }
    }
    Ok(written)
}

/// Apply the transition due for `channel` now, if any. Errors are logged:
/// the keeper tries again on its next pass.
pub async fn check_room(state: &AppState, channel: &ChannelName) {
    if let Err(e) = try_check_room(state, channel).await {
        tracing::warn!(room = %channel, error = %e, "room check failed; retrying on the next pass");
    }
}

async fn try_check_room(state: &AppState, channel: &ChannelName) -> Result<(), EngineError> {
    let Ok(ns) = state.config().namespaces.resolve(channel) else { return Ok(()) };
    for _ in 0..CAS_RETRIES {
        let Some(room) = state.engine.room(channel).await? else { return Ok(()) };
        let host_present = state.engine.presence_has_user(channel, &room.host).await?;
        let Some((to, reason)) = room.due(host_present, now_ms()) else { return Ok(()) };
        let next = room.change(Some(to), None, now_ms()).expect("due transitions are legal");
        match write_room(state, ns, channel, Some(room.version), next, reason).await? {
            RoomWritten::Written { .. } => return Ok(()),
            RoomWritten::Conflict { .. } => continue, // changed meanwhile: decide again
        }
    }
    Ok(())
}

/// Cancel every pending schedule of `channel` (its room closed). Bounded:
/// pages of 256 until none is left or nothing could be cancelled.
async fn cancel_channel(state: &AppState, channel: &ChannelName) {
    for _ in 0..1024 {
        let page = match state.engine.scheduled(channel, 256).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(channel = %channel, error = %e, "listing a closed room's schedules failed; they are cancelled when due");
                return;
            }
        };
        if page.is_empty() {
            return;
        }
        let mut removed = 0;
        for s in &page {
            if let Ok(Some(_)) = state.engine.schedule_cancel(&s.id).await {
                state.metrics.scheduled_cancelled.inc();
                removed += 1;
            }
        }
        if removed == 0 {
            return;
        }
    }
}
