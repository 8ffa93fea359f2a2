//! A channel's messages: publish (`POST /api/v1/channels/{channel}/messages`
//! and the batch `POST /api/v1/publish`, each immediate or scheduled) and
//! history (`GET /api/v1/channels/{channel}/messages`).

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use herald_core::Receipt;
use herald_proto::{
    BatchBody, BatchItem, BatchProblem, BatchReply, ErrorCode, HistoryPage, HistoryQuery, ItemError,
    PublishBody, Published, StoredFrame,
};
use tracing::Instrument;

use super::{json_bytes_response, json_response, scheduled, St};
use crate::api::extract::{page_limit, ApiKey, Body, Chan, IdempotencyKey, Q};
use crate::error::ApiError;
use crate::publish::{fingerprint, Publish, ScopedKey, Targets};
use crate::trace::{TraceParent, TARGET};

fn published(r: &Receipt) -> Published {
    Published {
        channel: r.channel.to_string(),
        seq: r.seq,
        id: r.id.to_string(),
        epoch: Some(r.epoch.to_string()),
    }
}

/// Durable appends answer 201 Created; volatile broadcasts 202 Accepted
/// (nothing is stored).
fn publish_status(durable: bool) -> StatusCode {
    if durable {
        StatusCode::CREATED
    } else {
        StatusCode::ACCEPTED
    }
}

/// `POST /api/v1/channels/{channel}/messages`, traced (`herald.publish`,
/// a child of the caller's `traceparent`).
pub async fn publish_one(
    state: St,
    key_scope: ApiKey,
    chan: Chan,
    TraceParent(tp): TraceParent,
    key: Result<IdempotencyKey, ApiError>,
    body: Body<PublishBody>,
) -> Result<Response, ApiError> {
    let span = tracing::trace_span!(target: TARGET, "herald.publish", channel = %chan.channel, messages = 1);
    crate::trace::continue_from(&span, tp.as_ref());
    publish_one_in(state, key_scope, chan, key, body).instrument(span).await
}

async fn publish_one_in(
    State(state): St,
    ApiKey(scope): ApiKey,
    Chan { channel, ns }: Chan,
    key: Result<IdempotencyKey, ApiError>,
    Body(PublishBody { data, meta, deliver_at, delay_ms }): Body<PublishBody>,
) -> Result<Response, ApiError> {
    let ns = &ns;
    let IdempotencyKey(key) = key?;
    if key.is_none() && ns.require_idempotency_key {
        return Err(ApiError::new(
            ErrorCode::IdempotencyKeyRequired,
            format!("namespace `{}` requires an Idempotency-Key header", channel.namespace()),
        ));
    }
    if scheduled::asked(deliver_at, delay_ms) {
        let ask = scheduled::ScheduleAsk {
            scope: &scope,
            key: key.as_deref(),
            targets: vec![(channel, ns)],
            data,
            meta,
            deliver_at,
            delay_ms,
            batch: false,
        };
        return scheduled::schedule(&state, ask).await;
    }
    // The same comparison as a batch of one: see `publish::fingerprint`.
    let dedup = key.map(|k| {
        let fp = fingerprint(std::slice::from_ref(&channel), &data, meta.as_ref());
        (ScopedKey::new(&scope, &k).anchor(), fp)
    });
    let receipt = state.publish(ns, Publish { channel, data, meta, dedup }).await?;
    // The `Published` reply, written directly (`Published::encode_parts`).
    let body = Published::encode_parts(
        receipt.channel.as_str(),
        receipt.seq,
        &receipt.id,
        Some(receipt.epoch.as_str()),
    );
    Ok(json_bytes_response(publish_status(ns.is_durable()), body, receipt.duplicate))
}

/// `POST /api/v1/publish`: one message to several channels. With an
/// Idempotency-Key the batch is one request under the key (see
/// [`AppState::publish_to_channels`]). Every check runs before anything is stored or
/// scheduled: the channels, `data`, the key, the rooms.
pub async fn publish_batch(
    state: St,
    key_scope: ApiKey,
    TraceParent(tp): TraceParent,
    key: Result<IdempotencyKey, ApiError>,
    body: Body<BatchBody>,
) -> Result<Response, ApiError> {
    let span = tracing::trace_span!(target: TARGET, "herald.publish", channels = body.0.channels.len());
    crate::trace::continue_from(&span, tp.as_ref());
    publish_batch_in(state, key_scope, key, body).instrument(span).await
}

async fn publish_batch_in(
    State(state): St,
    ApiKey(scope): ApiKey,
    key: Result<IdempotencyKey, ApiError>,
    Body(BatchBody { channels, data, meta, deliver_at, delay_ms }): Body<BatchBody>,
) -> Result<Response, ApiError> {
    let targets = state.batch_targets(&channels)?;
    state.check_publish_data(&data)?;
    let IdempotencyKey(key) = key?;
    if key.is_none() && targets.iter().any(|(_, ns)| ns.require_idempotency_key) {
        return Err(ApiError::new(
            ErrorCode::IdempotencyKeyRequired,
            "a channel's namespace requires an Idempotency-Key header",
        ));
    }
    if scheduled::asked(deliver_at, delay_ms) {
        let ask = scheduled::ScheduleAsk {
            scope: &scope,
            key: key.as_deref(),
            targets,
            data,
            meta,
            deliver_at,
            delay_ms,
            batch: true,
        };
        return scheduled::schedule(&state, ask).await;
    }
    let outcomes = state.publish_to_channels(&scope, key.as_deref(), &targets, &data, &meta).await?;
    Ok(batch_reply(&targets, &outcomes))
}

/// The reply: every channel's receipt (201, or 202 when no channel is
/// durable; replayed when every channel was), or, when one failed, the
/// first failure's problem document with every channel's outcome, so the
/// caller knows what landed; a retry with the same key completes the rest.
fn batch_reply(targets: &Targets<'_>, outcomes: &[Result<Receipt, ApiError>]) -> Response {
    let mut results = Vec::with_capacity(outcomes.len());
    let mut first_error: Option<ApiError> = None;
    let mut all_replayed = true;
    for ((channel, _), outcome) in targets.iter().zip(outcomes) {
        match outcome {
            Ok(r) => {
                all_replayed &= r.duplicate;
                results.push(BatchItem::from(published(r)));
            }
            Err(e) => {
                first_error.get_or_insert_with(|| e.clone());
                results.push(BatchItem {
                    channel: channel.to_string(),
                    seq: None,
                    id: None,
                    epoch: None,
                    error: Some(ItemError { code: e.code.as_str().to_owned(), detail: e.detail.clone() }),
                });
            }
        }
    }
    match first_error {
        None => {
            let durable = targets.iter().any(|(_, ns)| ns.is_durable());
            json_response(publish_status(durable), &BatchReply { results }, all_replayed)
        }
        Some(err) => {
            let problem =
                BatchProblem { problem: herald_proto::Problem::new(err.code, err.detail.clone()), results };
            let mut resp = err.into_response();
            *resp.body_mut() = axum::body::Body::from(serde_json::to_vec(&problem).expect("serialises"));
            resp
        }
    }
}

/// `GET /api/v1/channels/{channel}/messages?after=SEQ&limit=N`
pub async fn history(
    State(state): St,
    _: ApiKey,
    Chan { channel, ns }: Chan,
    query: Result<Q<HistoryQuery>, ApiError>,
) -> Result<Response, ApiError> {
    let Q(q) = query?;
    if !ns.is_durable() {
        return Err(ApiError::new(ErrorCode::NotSupported, "volatile channels keep no history"));
    }
    let max = state.config().history.max_limit;
    let limit = page_limit(q.limit, 100.min(max), max)?;
    let page = state.engine.read(&channel, q.after, limit).await?;
    // Each message as stored, `data` as the publisher sent it: the frames
    // are read in place and the page is written straight to bytes, never
    // through a JSON value (which would reorder keys, round big numbers and
    // refuse what it cannot represent).
    let mut messages = Vec::with_capacity(page.messages.len());
    for m in &page.messages {
        let frame = StoredFrame::parse(&m.frame).map_err(|e| {
            tracing::error!(channel = %channel, seq = ?m.seq, error = %e, "stored frame unreadable");
            ApiError::new(ErrorCode::Internal, "a stored message is unreadable")
        })?;
        messages.push(frame);
    }
    let body = HistoryPage {
        channel: channel.as_str(),
        epoch: page.position.epoch.as_str(),
        first: page.position.first,
        head: page.position.head,
        messages,
    }
    .encode();
    Ok(([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response())
}
