//! Delivery receipts: the cursors of an acked channel
//! (`GET /api/v1/channels/{channel}/cursors`) and a user's inbox
//! (`GET /api/v1/users/{user}/inbox`).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use herald_proto::{
    check_id, ChannelName, CursorsPage, ErrorCode, Inbox, InboxChannel, InboxDevice, LimitQuery,
    SubscriberCursor,
};

use super::{json_response, St};
use crate::api::extract::{page_limit, ApiKey, Chan, Q};
use crate::error::ApiError;

/// Most cursors one receipts or inbox request returns.
const MAX_CURSORS: usize = 10_000;

fn cursor_limit(q: Result<Q<LimitQuery>, ApiError>) -> Result<usize, ApiError> {
    let Q(q) = q?;
    page_limit(q.limit, 1000, MAX_CURSORS)
}

/// `GET /api/v1/channels/{channel}/cursors`: delivery receipts of an acked
/// channel: every subscriber's cursor, unread count and last ack time.
pub async fn cursors(
    State(state): St,
    _: ApiKey,
    Chan { channel, ns }: Chan,
    query: Result<Q<LimitQuery>, ApiError>,
) -> Result<Response, ApiError> {
    let limit = cursor_limit(query)?;
    if ns.delivery != herald_core::Delivery::Acked {
        return Err(ApiError::new(
            ErrorCode::NotSupported,
            "cursors exist only on channels with delivery = \"acked\"",
        ));
    }
    let pos = state.engine.position(&channel).await?;
    let list = state.engine.cursors(&channel, limit).await?;
    let cursors = list
        .iter()
        .map(|(sub, c)| SubscriberCursor {
            user: sub.user().to_owned(),
            device: sub.device().map(str::to_owned),
            cursor: c.seq,
            unread: pos.head.saturating_sub(c.seq),
            acked_at: c.acked_at_ms,
        })
        .collect();
    let body = CursorsPage {
        channel: channel.to_string(),
        epoch: pos.epoch.to_string(),
        first: pos.first,
        head: pos.head,
        cursors,
    };
    Ok(json_response(StatusCode::OK, &body, false))
}

/// `GET /api/v1/users/{user}/inbox`: for each acked channel of the user (its
/// `user:{user}` channel and every channel it has a cursor on): head, cursor
/// per device, unread.
pub async fn inbox(
    State(state): St,
    Path(user): Path<String>,
    _: ApiKey,
    query: Result<Q<LimitQuery>, ApiError>,
) -> Result<Response, ApiError> {
    let limit = cursor_limit(query)?;
    check_id(&user).map_err(|e| ApiError::new(ErrorCode::BadRequest, format!("`user` {e}")))?;
    let mut by_channel: std::collections::BTreeMap<ChannelName, Vec<InboxDevice>> = Default::default();
    if let Ok(own) = ChannelName::new(&format!("user:{user}")) {
        if state.config().namespaces.resolve(&own).is_ok_and(|ns| ns.delivery == herald_core::Delivery::Acked)
        {
            by_channel.entry(own).or_default();
        }
    }
    let list = state.engine.user_cursors(&user, limit).await?;
    for uc in &list {
        by_channel.entry(uc.channel.clone()).or_default().push(InboxDevice {
            device: uc.device.as_deref().map(str::to_owned),
            cursor: uc.cursor.seq,
            acked_at: uc.cursor.acked_at_ms,
            unread: 0,
        });
    }
    let mut channels = Vec::with_capacity(by_channel.len());
    for (channel, mut devices) in by_channel {
        let pos = state.engine.position(&channel).await?;
        for d in &mut devices {
            d.unread = pos.head.saturating_sub(d.cursor);
        }
        // A device that never acked has everything retained unread.
        let unread_new_device = pos.head + 1 - pos.first;
        channels.push(InboxChannel {
            channel: channel.to_string(),
            epoch: pos.epoch.to_string(),
            first: pos.first,
            head: pos.head,
            unread_without_cursor: unread_new_device,
            devices,
        });
    }
    Ok(json_response(StatusCode::OK, &Inbox { user, channels }, false))
}
