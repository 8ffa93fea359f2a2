//! The backend's actions on users, on every node (`crate::control`):
//! `/api/v1/users/{user}/connections`, `…/disconnect`, `…/revoke`,
//! `…/subscriptions`, and a room's member removal,
//! `DELETE /api/v1/rooms/{room}/members/{user}`.
//!
//! Each action is checked here (user, device and channel by the usual
//! rules: a clear problem otherwise), logged (the API key's name, the
//! user, what; never a token), counted (`herald_control_actions_total`),
//! and sent to every node; it answers `202` with what it stored, once the
//! order is on the control channel. Every action is idempotent.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use herald_core::{Ban, RoomWritten};
use herald_proto::{
    close, ActionReply, ConnectionInfo, ConnectionsReply, DisconnectBody, ErrorCode, RevokeBody,
    UserSubscribeBody,
};

use super::{json_response, St};
use crate::api::extract::{parse_channel, ApiKey, Body};
use crate::control::{check_user, now_ms, Message, Query, MAX_REASON_LEN};
use crate::error::ApiError;
use crate::state::AppState;

/// Longest ban: a year.
pub const MAX_BAN_SECONDS: u64 = 366 * 24 * 3600;

fn accepted(reply: &ActionReply) -> Response {
    json_response(StatusCode::ACCEPTED, reply, false)
}

fn reply(user: &str, action: &str) -> ActionReply {
    ActionReply { user: user.to_owned(), action: action.to_owned(), ..Default::default() }
}

/// `GET /api/v1/users/{user}/connections`: every node's, gathered.
pub async fn connections(
    State(state): St,
    ApiKey(scope): ApiKey,
    Path(user): Path<String>,
) -> Result<Response, ApiError> {
    check_user("user", &user)?;
    state.metrics.control_action("list_connections");
    tracing::debug!(scope, user = %user, "connections listed");
    let gathered = state.control.ask(&state, Query::Connections { user }).await?;
    let mut connections: Vec<ConnectionInfo> = Vec::new();
    for (node, body) in gathered.answers {
        match serde_json::from_value::<Vec<ConnectionInfo>>(body) {
            Ok(list) => connections.extend(list),
            Err(e) => tracing::warn!(node = %node, error = %e, "malformed connections answer ignored"),
        }
    }
    connections.sort_by(|a, b| (a.connected_at_ms, &a.id).cmp(&(b.connected_at_ms, &b.id)));
    let body = ConnectionsReply { connections, nodes_missing: gathered.missing };
    Ok(json_response(StatusCode::OK, &body, false))
}

/// `POST /api/v1/users/{user}/disconnect`.
pub async fn disconnect(
    State(state): St,
    ApiKey(scope): ApiKey,
    Path(user): Path<String>,
    Body(req): Body<DisconnectBody>,
) -> Result<Response, ApiError> {
    check_user("user", &user)?;
    if let Some(d) = &req.device {
        check_user("device", d)?;
    }
    if let Some(c) = &req.connection {
        if c.is_empty() || c.len() > 255 || c.chars().any(char::is_control) {
            return Err(ApiError::new(
                ErrorCode::BadRequest,
                "`connection` must be an id of the connection listing",
            ));
        }
    }
    let reason = req.reason.clone().unwrap_or_else(|| "disconnected by the server".to_owned());
    if reason.len() > MAX_REASON_LEN || reason.chars().any(char::is_control) {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            format!("`reason` must be at most {MAX_REASON_LEN} bytes without control characters"),
        ));
    }
    let mut out = reply(&user, "disconnect");
    if let Some(secs) = req.ban_seconds {
        if !(1..=MAX_BAN_SECONDS).contains(&secs) {
            return Err(ApiError::new(
                ErrorCode::BadRequest,
                format!("`ban_seconds` must be 1..={MAX_BAN_SECONDS}"),
            ));
        }
        if req.connection.is_some() {
            return Err(ApiError::new(
                ErrorCode::BadRequest,
                "a ban is of a user or a device, not of one connection",
            ));
        }
        let until = now_ms().saturating_add(secs * 1000);
        // Stored before the order goes out: a client that reconnects at
        // once, to any node, is refused.
        state.engine.ban(&Ban { user: user.clone(), device: req.device.clone(), until_ms: until }).await?;
        state.metrics.control_action("ban");
        out.banned_until_ms = Some(until);
    }
    let code = if req.reconnect { close::DISCONNECTED } else { close::DISCONNECTED_FOR_GOOD };
    tracing::info!(
        scope,
        user = %user,
        device = req.device.as_deref().unwrap_or(""),
        connection = req.connection.as_deref().unwrap_or(""),
        reconnect = req.reconnect,
        ban_seconds = req.ban_seconds.unwrap_or(0),
        "disconnect requested"
    );
    state.metrics.control_action("disconnect");
    let msg = Message::Disconnect {
        user,
        device: req.device,
        connection: req.connection,
        code,
        reason,
        reconnect: req.reconnect,
    };
    state.control.send(&state, &msg).await?;
    Ok(accepted(&out))
}

/// `POST /api/v1/users/{user}/revoke`.
pub async fn revoke(
    State(state): St,
    ApiKey(scope): ApiKey,
    Path(user): Path<String>,
    Body(req): Body<RevokeBody>,
) -> Result<Response, ApiError> {
    check_user("user", &user)?;
    if req.issued_before_ms == 0 {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            "`issued_before_ms` must be a time (ms since the Unix epoch)",
        ));
    }
    // Stored first: a token of before is refused on every node from now on.
    let before = state.engine.revoke(&user, req.issued_before_ms).await?;
    tracing::info!(scope, user = %user, issued_before_ms = before, "sessions revoked");
    state.metrics.control_action("revoke");
    state.control.send(&state, &Message::Revoke { user: user.clone(), before_ms: before }).await?;
    let mut out = reply(&user, "revoke");
    out.issued_before_ms = Some(before);
    Ok(accepted(&out))
}

/// `POST /api/v1/users/{user}/subscriptions`.
pub async fn subscribe(
    State(state): St,
    ApiKey(scope): ApiKey,
    Path(user): Path<String>,
    Body(req): Body<UserSubscribeBody>,
) -> Result<Response, ApiError> {
    check_user("user", &user)?;
    if let Some(d) = &req.device {
        check_user("device", d)?;
    }
    let (channel, ns) = parse_channel(&state, &req.channel)?;
    if ns.room {
        match state.engine.room(&channel).await? {
            None => return Err(crate::rooms::no_such_room()),
            Some(room) if room.is_removed(&user) => {
                return Err(ApiError::new(ErrorCode::Forbidden, "the user was removed from this room"))
            }
            Some(_) => {}
        }
    }
    if req.since.is_some() && !ns.is_durable() {
        return Err(ApiError::new(
            ErrorCode::NotSupported,
            "`since` needs a durable channel (it has no log)",
        ));
    }
    tracing::info!(scope, user = %user, channel = %channel, device = req.device.as_deref().unwrap_or(""), "server-side subscribe");
    state.metrics.control_action("subscribe");
    let msg = Message::Subscribe {
        user: user.clone(),
        device: req.device,
        channel: channel.to_string(),
        since: req.since,
    };
    state.control.send(&state, &msg).await?;
    Ok(accepted(&reply(&user, "subscribe")))
}

/// `DELETE /api/v1/users/{user}/subscriptions/{channel}`.
pub async fn unsubscribe(
    State(state): St,
    ApiKey(scope): ApiKey,
    Path((user, channel)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    check_user("user", &user)?;
    let (channel, _) = parse_channel(&state, &channel)?;
    tracing::info!(scope, user = %user, channel = %channel, "server-side unsubscribe");
    state.metrics.control_action("unsubscribe");
    unsubscribe_everywhere(&state, &user, &channel).await?;
    Ok(accepted(&reply(&user, "unsubscribe")))
}

async fn unsubscribe_everywhere(
    state: &AppState,
    user: &str,
    channel: &herald_proto::ChannelName,
) -> Result<(), ApiError> {
    let msg = Message::Unsubscribe { user: user.to_owned(), device: None, channel: channel.to_string() };
    state.control.send(state, &msg).await
}

/// `DELETE /api/v1/rooms/{room}/members/{user}`: the room records the
/// removal (its subscribes are refused from then on, on every node), the
/// user's connections are unsubscribed from the room's channel, and its
/// leases there end now, each with its `leave`.
pub async fn remove_member(
    State(state): St,
    ApiKey(scope): ApiKey,
    Path((room, user)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let (channel, ns) = parse_channel(&state, &room)?;
    if !ns.room {
        return Err(ApiError::new(
            ErrorCode::NotSupported,
            format!("namespace `{}` is not a room namespace (room = true)", channel.namespace()),
        ));
    }
    let ns = ns.clone();
    check_user("user", &user)?;
    // Recorded first: a rejoin racing the unsubscribe is refused.
    for attempt in 0.. {
        let room = state.engine.room(&channel).await?.ok_or_else(crate::rooms::no_such_room)?;
        if room.state == herald_core::RoomStatus::Closed {
            return Err(ApiError::new(ErrorCode::ChannelClosed, "the room is closed"));
        }
        let Some(next) = room.remove_member(&user, now_ms()) else { break };
        if next.removed.len() > herald_core::Room::MAX_REMOVED {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!("a room records at most {} removed users", herald_core::Room::MAX_REMOVED),
            ));
        }
        let written = crate::rooms::write_room(
            &state,
            &ns,
            &channel,
            Some(room.version),
            next,
            herald_core::RoomReason::MemberRemoved,
        )
        .await?;
        match written {
            RoomWritten::Written { .. } => break,
            RoomWritten::Conflict { .. } if attempt < 8 => continue,
            RoomWritten::Conflict { .. } => {
                return Err(ApiError::new(ErrorCode::Conflict, "the room changed too often to remove; retry"))
            }
        }
    }
    tracing::info!(scope, user = %user, room = %channel, "room member removed");
    state.metrics.control_action("remove_member");
    unsubscribe_everywhere(&state, &user, &channel).await?;
    // Leases of connections on nodes that miss the order (or of sessions
    // that end before they take it) end here.
    let ended = crate::rooms::remove_user(&state, &channel, &user).await?;
    tracing::debug!(room = %channel, user = %user, leases = ended, "removed member's leases ended");
    Ok(accepted(&reply(&user, "remove_member")))
}
