//! The deployment as a whole: `GET /api/v1/channels` (the channels with a
//! subscriber on some node now, gathered from every node) and
//! `GET /api/v1/nodes` (the engine's node registry).

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use herald_proto::{ChannelInfo, ChannelsQuery, ChannelsReply, ErrorCode, NodesReply};

use super::{json_response, St};
use crate::api::extract::{page_limit, ApiKey, Q};
use crate::control::{Query, CHANNELS_DEFAULT, CHANNELS_MAX};
use crate::error::ApiError;

/// `GET /api/v1/channels?pattern=&limit=&after=`: in name order, with the
/// subscriptions of every node summed. Each node lists at most `limit`
/// channels after `after`, so the merged first `limit` are exact.
pub async fn channels(State(state): St, _: ApiKey, Q(q): Q<ChannelsQuery>) -> Result<Response, ApiError> {
    let limit = page_limit(q.limit, CHANNELS_DEFAULT, CHANNELS_MAX)?;
    if q.pattern.as_ref().is_some_and(|p| p.is_empty() || p.len() > herald_proto::MAX_CHANNEL_LEN) {
        return Err(ApiError::new(ErrorCode::BadRequest, "`pattern` must be 1..=255 bytes"));
    }
    state.metrics.control_action("list_channels");
    let query = Query::Channels { pattern: q.pattern, after: q.after, limit };
    let gathered = state.control.ask(&state, query).await?;
    let mut merged: BTreeMap<String, u64> = BTreeMap::new();
    let mut full_node = false;
    for (node, body) in gathered.answers {
        match serde_json::from_value::<Vec<(String, u64)>>(body) {
            Ok(list) => {
                full_node |= list.len() >= limit;
                for (channel, n) in list {
                    *merged.entry(channel).or_default() += n;
                }
            }
            Err(e) => tracing::warn!(node = %node, error = %e, "malformed channels answer ignored"),
        }
    }
    let more = merged.len() > limit || full_node;
    let channels: Vec<ChannelInfo> = merged
        .into_iter()
        .take(limit)
        .map(|(channel, subscribers)| ChannelInfo { channel, subscribers })
        .collect();
    let next = if more { channels.last().map(|c| c.channel.clone()) } else { None };
    let body = ChannelsReply { channels, next, nodes_missing: gathered.missing };
    Ok(json_response(StatusCode::OK, &body, false))
}

/// `GET /api/v1/nodes`: every node whose lease holds, in id order; this
/// node's own figures are read now, the others' are their last report
/// (at most `control::NODE_REPORT` old).
pub async fn nodes(State(state): St, _: ApiKey) -> Result<Response, ApiError> {
    state.metrics.control_action("list_nodes");
    let own = state.control.report(&state);
    let nodes = state
        .engine
        .nodes()
        .await?
        .into_iter()
        .map(|n| if n.id == own.id { own.clone() } else { n })
        .collect();
    Ok(json_response(StatusCode::OK, &NodesReply { nodes }, false))
}
