//! HTTP API of rooms and presence: `/api/v1/rooms/{room}` and
//! `/api/v1/channels/{channel}/presence`.
//!
//! Changes take an optional `If-Match: "<version>"`. With it, a change
//! applies only to that version (412 otherwise); without it, the change
//! applies to whatever version is current (read, change, compare-and-set,
//! retried on a race). Either way each success writes exactly one new
//! version, and an illegal transition is 409. Both errors carry the room's
//! current state in the problem's `current` field.

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use herald_core::{NamespaceOptions, Room, RoomReason, RoomStatus, RoomWritten, SubscriberId};
use herald_proto::{
    ChannelName, CreateRoomBody, ErrorCode, Member, PatchRoomBody, PresenceQuery, PresenceReply, RoomView,
};

use super::St;
use crate::api::extract::{page_limit, ApiKey, Body, Chan, RoomChan};
use crate::error::ApiError;
use crate::rooms::{self, now_ms};
use crate::state::AppState;

/// Longest grace period a room may ask for.
const MAX_GRACE_SECS: u64 = 30 * 24 * 3600;
/// Read-change-write attempts of a change without `If-Match`.
const CHANGE_RETRIES: usize = 8;

/// The room as the API shows it; `members` is `None` for errors, where a
/// listing is not worth another read.
fn view(channel: &ChannelName, room: &Room, members: Option<(u64, Vec<Member>)>) -> RoomView {
    let (member_count, members) = members.map_or((None, None), |(n, m)| (Some(n), Some(m)));
    RoomView {
        room: channel.to_string(),
        state: room.state,
        version: room.version,
        host: room.host.clone(),
        attributes: room.attributes.clone(),
        grace_period: room.grace_period_ms / 1000,
        grace_until_ms: room.grace_until_ms,
        created_at_ms: room.created_at_ms,
        updated_at_ms: room.updated_at_ms,
        member_count,
        members,
        removed: room.removed.clone(),
    }
}

/// The room without its members, as a problem's `current`.
fn current(channel: &ChannelName, room: &Room) -> serde_json::Value {
    serde_json::to_value(view(channel, room, None)).expect("room views serialise")
}

async fn respond(state: &AppState, status: StatusCode, channel: &ChannelName, room: &Room) -> Response {
    let members = if room.state == RoomStatus::Closed {
        (0, Vec::new())
    } else {
        match rooms::members(state, channel, state.config().presence.max_members_listed).await {
            Ok(m) => m,
            Err(e) => return ApiError::from(e).into_response(),
        }
    };
    let body = serde_json::to_vec(&view(channel, room, Some(members))).expect("room views serialise");
    let mut resp = (status, body).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(
        header::ETAG,
        HeaderValue::from_str(&format!("\"{}\"", room.version)).expect("digits are valid"),
    );
    resp
}

/// `If-Match: "7"` (also `W/"7"` and a bare `7`); `*` means any version.
fn if_match(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(v) = headers.get(header::IF_MATCH) else { return Ok(None) };
    let bad =
        || ApiError::new(ErrorCode::BadRequest, "If-Match must be a room version in quotes, like \"3\"");
    let s = v.to_str().map_err(|_| bad())?.trim();
    if s == "*" {
        return Ok(None);
    }
    let s = s.strip_prefix("W/").unwrap_or(s);
    let s = s.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(s);
    s.parse().map(Some).map_err(|_| bad())
}

fn check_attributes(
    state: &AppState,
    attrs: &serde_json::Map<String, serde_json::Value>,
) -> Result<(), ApiError> {
    let len = serde_json::to_vec(attrs).map(|v| v.len()).unwrap_or(usize::MAX);
    let max = state.config().websocket.max_message_bytes / 2;
    if len > max {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("`attributes` is larger than {max} bytes"),
        ));
    }
    // Every room event carries the attributes one level down in its `data`,
    // which keeps to the publish rule on depth like any other `data`.
    let max_depth = state.config().publish.max_data_depth;
    if 1 + depth(attrs.values()) >= max_depth {
        return Err(ApiError::new(
            ErrorCode::BadData,
            format!("`attributes` nests deeper than {} levels", max_depth.saturating_sub(1)),
        ));
    }
    Ok(())
}

/// The nesting depth of the deepest of `values` (a scalar is 0). Bounded by
/// the body parser's own recursion limit.
fn depth<'a>(values: impl Iterator<Item = &'a serde_json::Value>) -> usize {
    values
        .map(|v| match v {
            serde_json::Value::Array(a) => 1 + depth(a.iter()),
            serde_json::Value::Object(o) => 1 + depth(o.values()),
            _ => 0,
        })
        .max()
        .unwrap_or(0)
}

/// `PUT /api/v1/rooms/{room}`: create; 201, or 409 if it exists.
pub async fn create_room(
    State(state): St,
    _: ApiKey,
    RoomChan(Chan { channel, ns }): RoomChan,
    Body(req): Body<CreateRoomBody>,
) -> Result<Response, ApiError> {
    let ns = &ns;
    if SubscriberId::new(req.host.as_str(), None).is_err() {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            "`host` must be a user id: 1..=255 bytes without control characters",
        ));
    }
    check_attributes(&state, &req.attributes)?;
    let grace_ms = match req.grace_period {
        None => u64::try_from(ns.grace_period.as_millis()).unwrap_or(u64::MAX),
        Some(s) if (1..=MAX_GRACE_SECS).contains(&s) => s * 1000,
        Some(_) => {
            return Err(ApiError::new(
                ErrorCode::BadRequest,
                format!("`grace_period` must be 1..={MAX_GRACE_SECS} seconds"),
            ))
        }
    };
    let room = Room::new(req.host, req.attributes, grace_ms, now_ms());
    match rooms::write_room(&state, ns, &channel, None, room, RoomReason::Created).await? {
        RoomWritten::Written { room, .. } => {
            // The host may be present already (subscribed before creation is
            // not possible, but another node may race): settle it now.
            rooms::check_room(&state, &channel).await;
            let room = state.engine.room(&channel).await?.unwrap_or(room);
            Ok(respond(&state, StatusCode::CREATED, &channel, &room).await)
        }
        RoomWritten::Conflict { current: cur } => {
            let err = ApiError::new(ErrorCode::Conflict, "the room exists already");
            Err(match cur {
                Some(r) => err.with_current(current(&channel, &r)),
                None => err,
            })
        }
    }
}

/// `GET /api/v1/rooms/{room}`.
pub async fn get_room(
    State(state): St,
    _: ApiKey,
    RoomChan(Chan { channel, .. }): RoomChan,
) -> Result<Response, ApiError> {
    let room = state.engine.room(&channel).await?.ok_or_else(rooms::no_such_room)?;
    Ok(respond(&state, StatusCode::OK, &channel, &room).await)
}

/// `PATCH /api/v1/rooms/{room}`: `{"state"?, "attributes"?}`.
pub async fn patch_room(
    State(state): St,
    _: ApiKey,
    RoomChan(Chan { channel, ns }): RoomChan,
    headers: HeaderMap,
    body: Result<Body<PatchRoomBody>, ApiError>,
) -> Result<Response, ApiError> {
    let expected = if_match(&headers)?;
    let Body(req) = body?;
    if req.state.is_none() && req.attributes.is_none() {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            "nothing to change: give `state` and/or `attributes`",
        ));
    }
    if let Some(a) = &req.attributes {
        check_attributes(&state, a)?;
    }
    change(&state, &ns, &channel, expected, req.state, req.attributes).await
}

/// `DELETE /api/v1/rooms/{room}`: close it (final event, members
/// unsubscribed, no more publishes).
pub async fn delete_room(
    State(state): St,
    _: ApiKey,
    RoomChan(Chan { channel, ns }): RoomChan,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let expected = if_match(&headers)?;
    change(&state, &ns, &channel, expected, Some(RoomStatus::Closed), None).await
}

async fn change(
    state: &AppState,
    ns: &NamespaceOptions,
    channel: &ChannelName,
    expected: Option<u64>,
    to: Option<RoomStatus>,
    attributes: Option<serde_json::Map<String, serde_json::Value>>,
) -> Result<Response, ApiError> {
    for _ in 0..CHANGE_RETRIES {
        let room = state.engine.room(channel).await?.ok_or_else(rooms::no_such_room)?;
        if expected.is_some_and(|v| v != room.version) {
            return Err(stale(channel, &room));
        }
        let next = room.change(to, attributes.clone(), now_ms()).map_err(|e| {
            ApiError::new(ErrorCode::Conflict, e.to_string()).with_current(current(channel, &room))
        })?;
        match rooms::write_room(state, ns, channel, Some(room.version), next, RoomReason::Api).await? {
            RoomWritten::Written { room, .. } => {
                return Ok(respond(state, StatusCode::OK, channel, &room).await)
            }
            RoomWritten::Conflict { current: Some(cur) } if expected.is_some() => {
                return Err(stale(channel, &cur))
            }
            RoomWritten::Conflict { current: None } => return Err(rooms::no_such_room()),
            RoomWritten::Conflict { .. } => continue, // raced without If-Match: read again
        }
    }
    Err(ApiError::new(ErrorCode::Conflict, "the room changed too often to apply this change; retry"))
}

fn stale(channel: &ChannelName, room: &Room) -> ApiError {
    ApiError::new(
        ErrorCode::PreconditionFailed,
        format!("If-Match does not match the room's version {}", room.version),
    )
    .with_current(current(channel, room))
}

/// `GET /api/v1/channels/{channel}/presence[?count=1][&limit=N]`.
pub async fn presence(
    State(state): St,
    Query(q): Query<PresenceQuery>,
    _: ApiKey,
    Chan { channel, ns }: Chan,
) -> Result<Response, ApiError> {
    let ns = &ns;
    if !ns.presence {
        return Err(ApiError::new(
            ErrorCode::NotSupported,
            "this namespace has no presence (presence = true)",
        ));
    }
    let count_only = matches!(q.count.as_deref(), Some("1" | "true"));
    let max = state.config().presence.max_members_listed;
    let limit = page_limit(q.limit, max, max)?;
    let (count, members) = rooms::list(&state, ns, &channel, count_only, limit).await?;
    let body = serde_json::to_vec(&PresenceReply { channel: channel.to_string(), count, members })
        .expect("serialises");
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}
