//! `/api/v1/webhooks`: the delivery status of every webhook, and the
//! operator's `skip` and `retry` of one channel.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use herald_proto::{
    ChannelName, ErrorCode, WebhookChannelStatus, WebhookError, WebhookRetrying, WebhookSkipped,
    WebhookStatus, WebhooksStatus,
};

use crate::api::extract::ApiKey;
use crate::error::ApiError;
use crate::integration::webhooks::Hook;
use crate::rooms::now_ms;
use crate::state::AppState;

/// Channels reported per webhook.
const STATUS_LIMIT: usize = 10_000;

fn hook(state: &AppState, name: &str) -> Result<Arc<Hook>, ApiError> {
    state
        .webhooks
        .get(name)
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, "no webhook with this name is configured"))
}

fn channel(hook: &Hook, ch: &str) -> Result<ChannelName, ApiError> {
    let ch = ChannelName::new(ch).map_err(|e| ApiError::new(ErrorCode::BadChannel, e.to_string()))?;
    if !hook.cfg.matches(ch.as_str()) {
        return Err(ApiError::new(ErrorCode::NotFound, "the webhook does not deliver this channel"));
    }
    Ok(ch)
}

/// `GET /api/v1/webhooks`: per webhook, every channel with undelivered
/// messages or a failure: cursor, head, lag, the oldest undelivered
/// message's age, the last error seen by this node, how many undelivered
/// messages retention removed already (`overtaken`), and whether it is
/// stalled (failing or overtaken).
pub async fn status(State(state): State<Arc<AppState>>, _key: ApiKey) -> Result<Response, ApiError> {
    let mut out = Vec::new();
    for hook in state.webhooks.hooks().iter() {
        let cursors = state.engine.user_cursors(hook.sub.user(), STATUS_LIMIT).await?;
        let mut channels = Vec::new();
        let mut lag_total = 0u64;
        for c in cursors.into_iter().filter(|c| c.device.is_none()) {
            let pos = state.engine.position(&c.channel).await?;
            let lag = pos.head.saturating_sub(c.cursor.seq);
            let last_error = hook.last_error(&c.channel);
            if lag == 0 && last_error.is_none() {
                continue;
            }
            lag_total += lag;
            let mut oldest_age_ms = None;
            let mut overtaken = 0;
            if lag > 0 {
                let page = state.engine.read(&c.channel, c.cursor.seq, 1).await?;
                if let Some(m) = page.messages.first() {
                    oldest_age_ms = Some(now_ms().saturating_sub(m.ts));
                    // Not yet seen by a worker on this node, but already gone.
                    // Undelivered messages retention removed already.
                    overtaken = m.seq.unwrap_or(0).saturating_sub(c.cursor.seq + 1);
                }
            }
            let stalled = overtaken > 0 || (lag > 0 && last_error.is_some());
            channels.push(WebhookChannelStatus {
                channel: c.channel.as_str().to_owned(),
                cursor: c.cursor.seq,
                head: pos.head,
                lag,
                oldest_undelivered_age_ms: oldest_age_ms,
                last_error: last_error.map(|e| WebhookError {
                    at: e.at_ms,
                    class: e.class.to_owned(),
                    message: e.message,
                }),
                overtaken,
                stalled,
            });
        }
        out.push(WebhookStatus {
            name: hook.cfg.name.clone(),
            lag: lag_total,
            stalled: channels.iter().filter(|c| c.stalled).count() as u64,
            channels,
        });
    }
    Ok(Json(WebhooksStatus { webhooks: out }).into_response())
}

/// `POST /api/v1/webhooks/{name}/channels/{channel}/skip`: move the cursor
/// past the next undelivered message (a poison message the backend keeps
/// refusing). Logged at warn with the skipped seq.
pub async fn skip(
    State(state): State<Arc<AppState>>,
    ApiKey(scope): ApiKey,
    Path((name, ch)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    // The scope names the API key by a digest prefix, never the key.
    let hook = hook(&state, &name)?;
    let ch = channel(&hook, &ch)?;
    let cursor = state.engine.cursor(&ch, &hook.sub).await?.map_or(0, |c| c.seq);
    let page = state.engine.read(&ch, cursor, 1).await?;
    let Some(next) = page.messages.first().and_then(|m| m.seq) else {
        return Ok(
            Json(WebhookSkipped { channel: ch.as_str().to_owned(), skipped: None, cursor }).into_response()
        );
    };
    let new = state.engine.ack(&ch, &hook.sub, next).await.map_err(|e| match e {
        herald_core::AckError::Engine(e) => ApiError::from(e),
        other => ApiError::new(ErrorCode::Conflict, other.to_string()),
    })?;
    tracing::warn!(webhook = %name, channel = %ch, seq = next, by = %scope, "webhook message skipped by an operator");
    hook.errors.lock().expect("errors lock").remove(&ch);
    hook.retry(ch.clone());
    Ok(Json(WebhookSkipped { channel: ch.as_str().to_owned(), skipped: Some(next), cursor: new.seq })
        .into_response())
}

/// `POST /api/v1/webhooks/{name}/channels/{channel}/retry`: send the
/// channel's next request now instead of after its backoff.
pub async fn retry(
    State(state): State<Arc<AppState>>,
    _key: ApiKey,
    Path((name, ch)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let hook = hook(&state, &name)?;
    let ch = channel(&hook, &ch)?;
    hook.retry(ch.clone());
    let reply = WebhookRetrying { channel: ch.as_str().to_owned(), retrying: true };
    Ok((StatusCode::ACCEPTED, Json(reply)).into_response())
}
