//! `POST /api/v1/messages`: many messages in one request, each with its own
//! channel, `data`, `meta`, idempotency key and schedule, each answered on
//! its own, in request order.
//!
//! A message here is the single publish (`POST
//! /api/v1/channels/{channel}/messages`) written as one object: the same
//! checks, the same key scope and fingerprint (so its `idempotency_key` and
//! that endpoint's `Idempotency-Key` name the same thing), the same
//! metrics. What the batch adds: every immediate message goes to the engine
//! in one submission ([`AppState::publish_many`]: one group commit on the
//! embedded engine), and one refused message affects no other. A request
//! is refused whole only when it is malformed (not JSON of this shape,
//! outside `1..=publish.max_batch_messages` messages, an `Idempotency-Key`
//! header); otherwise it answers `200` with one result per message.

use std::collections::HashMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use herald_core::{NamespaceOptions, Receipt};
use herald_proto::{
    ChannelName, ErrorCode, ItemError, MessageItem, MessageResult, MessagesBody, MessagesReply, Meta,
};
use serde_json::value::RawValue;

use super::{json_response, scheduled, St};
use crate::api::extract::{parse_channel, ApiKey, Body, IdempotencyKey};
use crate::error::ApiError;
use crate::publish::{fingerprint, validate_idempotency_key, Publish, ScopedKey};
use crate::state::AppState;

/// A message checked and ready: appended now, or scheduled.
enum Ready<'a> {
    Now(Publish),
    Later(Later<'a>),
}

/// A scheduled message, its key owned until the schedule borrows it.
struct Later<'a> {
    key: Option<String>,
    channel: ChannelName,
    ns: &'a NamespaceOptions,
    data: Box<RawValue>,
    meta: Option<Meta>,
    deliver_at: Option<u64>,
    delay_ms: Option<u64>,
}

/// `POST /api/v1/messages`
pub async fn publish_messages(
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
    let max = state.config.publish.max_batch_messages;
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
    let mut now: Vec<(usize, Publish)> = Vec::new();
    let mut later = Vec::new();
    // Each key's first message in this request: a key names one message.
    let mut keys: HashMap<String, usize> = HashMap::new();
    // Each message's channel as the request named it, for its result.
    let channels: Vec<String> = messages.iter().map(|m| m.channel.clone()).collect();
    for (i, m) in messages.into_iter().enumerate() {
        match check(&state, &scope, m, i, &mut keys) {
            Ok(Ready::Now(p)) => now.push((i, p)),
            Ok(Ready::Later(l)) => later.push((i, l)),
            Err(e) => results[i] = Some(failed(channels[i].clone(), &e)),
        }
    }

    let (slots, items): (Vec<usize>, Vec<_>) = now.into_iter().map(|(i, p)| (i, Ok(p))).unzip();
    for (i, outcome) in slots.into_iter().zip(state.publish_many(items, true).await) {
        results[i] = Some(match outcome {
            Ok(r) => published(&r),
            Err(e) => failed(channels[i].clone(), &e),
        });
    }
    // After the immediate ones: each schedule is its own engine call, and
    // no order holds between a schedule and an append anyway.
    for (i, l) in later {
        let ask = scheduled::ScheduleAsk {
            scope: &scope,
            key: l.key.as_deref(),
            targets: vec![(l.channel, l.ns)],
            data: l.data,
            meta: l.meta,
            deliver_at: l.deliver_at,
            delay_ms: l.delay_ms,
            batch: false,
        };
        results[i] = Some(match scheduled::store(&state, ask).await {
            Ok(receipts) => {
                let r = &receipts[0];
                MessageResult::Scheduled {
                    scheduled_id: r.id.to_string(),
                    channel: r.channel.to_string(),
                    deliver_at: r.deliver_at,
                    replayed: r.duplicate,
                }
            }
            Err(e) => failed(channels[i].clone(), &e),
        });
    }

    let results: Vec<MessageResult> =
        results.into_iter().map(|r| r.expect("every message answered")).collect();
    let replayed = results.iter().all(MessageResult::is_replayed);
    Ok(json_response(StatusCode::OK, &MessagesReply { results }, replayed))
}

/// The checks of the single publish, in its order, for message `i`.
fn check<'a>(
    state: &'a AppState,
    scope: &str,
    m: MessageItem,
    i: usize,
    keys: &mut HashMap<String, usize>,
) -> Result<Ready<'a>, ApiError> {
    let MessageItem { channel, data, meta, idempotency_key: key, deliver_at, delay_ms } = m;
    let (channel, ns) = parse_channel(state, &channel)?;
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
    } else if ns.require_idempotency_key {
        return Err(ApiError::new(
            ErrorCode::IdempotencyKeyRequired,
            format!("namespace `{}` requires an idempotency_key", channel.namespace()),
        ));
    }
    if scheduled::asked(deliver_at, delay_ms) {
        return Ok(Ready::Later(Later { key, channel, ns, data, meta, deliver_at, delay_ms }));
    }
    let dedup = key.map(|k| {
        let fp = fingerprint(std::slice::from_ref(&channel), &data, meta.as_ref());
        (ScopedKey::new(scope, &k).anchor(), fp)
    });
    Ok(Ready::Now(Publish { channel, data, meta, dedup }))
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
