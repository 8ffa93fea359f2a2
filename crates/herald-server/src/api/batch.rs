//! `POST /api/v1/messages`: many messages in one request, each with its own
//! channel(s), `data`, `meta`, idempotency key and schedule, each answered
//! on its own, in request order.
//!
//! A message with `channel` is the single publish (`POST
//! /api/v1/channels/{channel}/messages`) written as one object; one with
//! `channels` is `POST /api/v1/publish`: the same checks, the same key scope
//! and fingerprint (so its `idempotency_key` and that endpoint's
//! `Idempotency-Key` name the same thing), the same metrics. What the batch
//! adds: every immediate message without a key to several channels, and
//! every immediate message to one channel, goes to the engine in one
//! submission ([`AppState::publish_many`]: one group commit on the embedded
//! engine), and one refused message affects no other. A keyed message to
//! several channels keeps `/publish`'s key protocol (its first channel
//! decides before the others are appended), so it is appended after that
//! submission, as schedules are stored. A request
//! is refused whole only when it is malformed (not JSON of this shape,
//! outside `1..=publish.max_batch_messages` messages, an `Idempotency-Key`
//! header); otherwise it answers `200` with one result per message.

use std::collections::HashMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use herald_core::Receipt;
use herald_proto::{
    ChannelName, ErrorCode, ItemError, MessageItem, MessageResult, MessagesBody, MessagesReply, Meta,
};
use serde_json::value::RawValue;
use tracing::Instrument;

use super::{json_response, scheduled, St};
use crate::api::extract::{parse_channel, ApiKey, Body, IdempotencyKey};
use crate::error::ApiError;
use crate::publish::{fingerprint, validate_idempotency_key, Publish, ScopedKey, Targets};
use crate::state::AppState;
use crate::trace::TraceParent;

/// A message checked and ready: appended now (in the one submission), or
/// after it (a keyed message to several channels, or a schedule).
enum Ready<'a> {
    Now(Vec<Publish>),
    Later(Later<'a>),
}

/// A message stored after the submission, its key owned until the engine
/// call borrows it.
struct Later<'a> {
    key: Option<String>,
    targets: Targets<'a>,
    data: Box<RawValue>,
    meta: Option<Meta>,
    deliver_at: Option<u64>,
    delay_ms: Option<u64>,
    /// Named with `channels`: answered with one result per channel.
    several: bool,
}

/// `POST /api/v1/messages`
pub async fn publish_messages(
    state: St,
    key_scope: ApiKey,
    TraceParent(tp): TraceParent,
    header_key: Result<IdempotencyKey, ApiError>,
    body: Body<MessagesBody>,
) -> Result<Response, ApiError> {
    let span = tracing::trace_span!(
        target: crate::trace::TARGET,
        "herald.publish",
        messages = body.0.messages.len(),
    );
    crate::trace::continue_from(&span, tp.as_ref());
    publish_messages_in(state, key_scope, header_key, body).instrument(span).await
}

async fn publish_messages_in(
    State(state): St,
    ApiKey(scope): ApiKey,
    header_key: Result<IdempotencyKey, ApiError>,
    Body(MessagesBody { messages }): Body<MessagesBody>,
) -> Result<Response, ApiError> {
    if header_key?.0.is_some() {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            "an Idempotency-Key header names one message: give each message its `idempotency_key`",
        ));
    }
    let max = state.config().publish.max_batch_messages;
    if messages.is_empty() {
        return Err(ApiError::new(ErrorCode::BadRequest, "`messages` is empty"));
    }
    if messages.len() > max {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("{} messages; at most {max} per request (publish.max_batch_messages)", messages.len()),
        ));
    }

    let mut results: Vec<Option<MessageResult>> = vec![None; messages.len()];
    // The submission's items, each with its message's index.
    let mut now: Vec<(usize, Publish)> = Vec::new();
    let mut later = Vec::new();
    // Each key's first message in this request: a key names one message.
    let mut keys: HashMap<String, usize> = HashMap::new();
    // Each message's channel(s) as the request named them, for its result.
    let named: Vec<Vec<String>> = messages.iter().map(named_channels).collect();
    let several: Vec<bool> = messages.iter().map(|m| !m.channels.is_empty()).collect();
    for (i, m) in messages.into_iter().enumerate() {
        match check(&state, &scope, m, i, &mut keys).await {
            Ok(Ready::Now(ps)) => now.extend(ps.into_iter().map(|p| (i, p))),
            Ok(Ready::Later(l)) => later.push((i, l)),
            Err(e) => results[i] = Some(failed_all(&named[i], several[i], &e)),
        }
    }

    // Per message, its channels' results in order (several channels) or
    // its one result.
    let mut parts: Vec<Vec<MessageResult>> = vec![Vec::new(); results.len()];
    let (slots, items): (Vec<usize>, Vec<_>) = now.into_iter().map(|(i, p)| (i, Ok(p))).unzip();
    for (i, outcome) in slots.into_iter().zip(state.publish_many(items, true).await) {
        let channel = &named[i][parts[i].len()];
        parts[i].push(match outcome {
            Ok(r) => published(&r),
            Err(e) => failed(channel.clone(), &e),
        });
    }
    for (i, p) in parts.into_iter().enumerate() {
        if !p.is_empty() {
            results[i] = Some(answer(p, several[i]));
        }
    }
    // After the submission: each is its own engine call (or calls), and no
    // order holds between a schedule and an append anyway.
    for (i, l) in later {
        results[i] = Some(match store_later(&state, &scope, l).await {
            Ok(r) => r,
            Err(e) => failed_all(&named[i], several[i], &e),
        });
    }

    let results: Vec<MessageResult> =
        results.into_iter().map(|r| r.expect("every message answered")).collect();
    let replayed = results.iter().all(MessageResult::is_replayed);
    Ok(json_response(StatusCode::OK, &MessagesReply { results }, replayed))
}

/// The channels a message names, as it names them.
fn named_channels(m: &MessageItem) -> Vec<String> {
    if m.channels.is_empty() {
        vec![m.channel.clone()]
    } else {
        m.channels.clone()
    }
}

/// A message's result from its channels' results.
fn answer(mut parts: Vec<MessageResult>, several: bool) -> MessageResult {
    if several {
        MessageResult::Channels { results: parts }
    } else {
        parts.pop().expect("one result")
    }
}

/// Every channel of a message failed with `e`.
fn failed_all(named: &[String], several: bool, e: &ApiError) -> MessageResult {
    answer(named.iter().map(|c| failed(c.clone(), e)).collect(), several)
}

/// A keyed message to several channels (`/publish`'s key protocol), or a
/// schedule.
async fn store_later(state: &AppState, scope: &str, l: Later<'_>) -> Result<MessageResult, ApiError> {
    let Later { key, targets, data, meta, deliver_at, delay_ms, several } = l;
    if !scheduled::asked(deliver_at, delay_ms) {
        let outcomes = state.publish_to_channels(scope, key.as_deref(), &targets, &data, &meta).await?;
        let parts = targets
            .iter()
            .zip(outcomes)
            .map(|((channel, _), outcome)| match outcome {
                Ok(r) => published(&r),
                Err(e) => failed(channel.to_string(), &e),
            })
            .collect();
        return Ok(answer(parts, several));
    }
    let ask = scheduled::ScheduleAsk {
        scope,
        key: key.as_deref(),
        targets,
        data,
        meta,
        deliver_at,
        delay_ms,
        batch: several,
    };
    let receipts = scheduled::store(state, ask).await?;
    let parts = receipts
        .iter()
        .map(|r| MessageResult::Scheduled {
            scheduled_id: r.id.to_string(),
            channel: r.channel.to_string(),
            deliver_at: r.deliver_at,
            replayed: r.duplicate,
        })
        .collect();
    Ok(answer(parts, several))
}

/// The checks of the single publish (or of `/publish`, for a message to
/// several channels), in its order, for message `i`.
async fn check<'a>(
    state: &'a AppState,
    scope: &str,
    m: MessageItem,
    i: usize,
    keys: &mut HashMap<String, usize>,
) -> Result<Ready<'a>, ApiError> {
    let MessageItem { channel, channels, data, meta, idempotency_key: key, deliver_at, delay_ms } = m;
    let several = !channels.is_empty();
    let targets = match (channel.is_empty(), several) {
        (false, false) => vec![parse_channel(state, &channel)?],
        (true, true) => state.batch_targets(&channels)?,
        (false, true) => {
            return Err(ApiError::new(ErrorCode::BadRequest, "give `channel` or `channels`, not both"));
        }
        (true, false) => {
            return Err(ApiError::new(ErrorCode::BadRequest, "a message needs `channel` or `channels`"));
        }
    };
    if let Some(meta) = &meta {
        herald_proto::validate_meta(meta).map_err(|e| ApiError::new(ErrorCode::BadRequest, e))?;
    }
    if let Some(k) = &key {
        validate_idempotency_key(k)?;
        if let Some(first) = keys.get(k) {
            return Err(ApiError::new(
                ErrorCode::BadRequest,
                format!("message {i} has the idempotency_key of message {first}: a key names one message"),
            ));
        }
        keys.insert(k.clone(), i);
    } else if let Some((channel, _)) = targets.iter().find(|(_, ns)| ns.require_idempotency_key) {
        return Err(ApiError::new(
            ErrorCode::IdempotencyKeyRequired,
            format!("namespace `{}` requires an idempotency_key", channel.namespace()),
        ));
    }
    if scheduled::asked(deliver_at, delay_ms) || (several && key.is_some()) {
        if several {
            // `/publish` checks `data` before anything; the single publish's
            // schedule checks it when stored.
            state.check_publish_data(&data)?;
        }
        return Ok(Ready::Later(Later { key, targets, data, meta, deliver_at, delay_ms, several }));
    }
    if several {
        // As `/publish`: every channel is checked before any is appended.
        state.check_publish_data(&data)?;
        crate::rooms::require_rooms(state, &targets).await?;
    }
    let dedup = |channel: &ChannelName| {
        key.as_ref().map(|k| {
            let fp = fingerprint(std::slice::from_ref(channel), &data, meta.as_ref());
            (ScopedKey::new(scope, k).anchor(), fp)
        })
    };
    Ok(Ready::Now(
        targets
            .into_iter()
            .map(|(channel, _)| Publish {
                dedup: dedup(&channel),
                channel,
                data: data.clone(),
                meta: meta.clone(),
            })
            .collect(),
    ))
}

fn published(r: &Receipt) -> MessageResult {
    MessageResult::Published {
        channel: r.channel.to_string(),
        seq: r.seq,
        id: r.id.to_string(),
        epoch: Some(r.epoch.to_string()),
        replayed: r.duplicate,
    }
}

fn failed(channel: String, e: &ApiError) -> MessageResult {
    MessageResult::Failed {
        channel,
        error: ItemError { code: e.code.as_str().to_owned(), detail: e.detail.clone() },
    }
}
