//! The HTTP API (`/api/v1`) and operations endpoints.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use herald_core::{Health, Receipt};
use herald_proto::{
    check_id, BatchBody, BatchItem, BatchProblem, BatchReply, ChannelName, CursorsPage, ErrorCode,
    HistoryPage, HistoryQuery, Inbox, InboxChannel, InboxDevice, ItemError, LimitQuery, PublishBody,
    Published, StoredFrame, SubscriberCursor,
};
use serde::Serialize;

use crate::error::ApiError;
// The preamble helpers under their old paths, for handlers that take
// headers and bytes themselves (new handlers: use the extractors).
#[allow(unused_imports)]
pub(crate) use crate::api::extract::{body_bytes, parse_channel, parse_json};
use crate::api::extract::{ApiKey, Body, Chan, IdempotencyKey, Q};
use crate::publish::{fingerprint, Publish, ScopedKey};
use crate::state::AppState;

type St = State<Arc<AppState>>;

fn published(r: &Receipt) -> Published {
    Published {
        channel: r.channel.to_string(),
        seq: r.seq,
        id: r.id.to_string(),
        epoch: Some(r.epoch.to_string()),
    }
}

fn json_response(status: StatusCode, body: &impl Serialize, replayed: bool) -> Response {
    json_bytes_response(status, serde_json::to_vec(body).expect("response serialises"), replayed)
}

fn json_bytes_response(status: StatusCode, bytes: Vec<u8>, replayed: bool) -> Response {
    let mut resp = (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], bytes)
        .into_response();
    if replayed {
        resp.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    resp
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

/// `POST /api/v1/channels/{channel}/messages`
pub async fn publish_one(
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
    if crate::api::scheduled::asked(deliver_at, delay_ms) {
        let ask = crate::api::scheduled::ScheduleAsk {
            scope: &scope,
            key: key.as_deref(),
            targets: vec![(channel, ns)],
            data,
            meta,
            deliver_at,
            delay_ms,
            batch: false,
        };
        return crate::api::scheduled::schedule(&state, ask).await;
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
/// `publish::ScopedKey`): its first channel's append decides whether it is
/// new, a replay or a mismatch, before any other channel is appended; each
/// other channel's append is deduplicated on its own, so a retry of a partly
/// failed batch completes it without doubling any channel.
pub async fn publish_batch(
    State(state): St,
    ApiKey(scope): ApiKey,
    key: Result<IdempotencyKey, ApiError>,
    Body(BatchBody { channels, data, meta, deliver_at, delay_ms }): Body<BatchBody>,
) -> Result<Response, ApiError> {
    if channels.is_empty() || channels.len() > state.config.limits.max_batch_channels {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            format!("`channels` must name 1..={} channels", state.config.limits.max_batch_channels),
        ));
    }
    // Validate everything before appending anything.
    let mut targets = Vec::with_capacity(channels.len());
    for name in &channels {
        let (channel, ns) = parse_channel(&state, name)?;
        if targets.iter().any(|(c, _)| c == &channel) {
            return Err(ApiError::new(ErrorCode::BadRequest, format!("channel `{channel}` is named twice")));
        }
        targets.push((channel, ns));
    }
    state.check_publish_data(&data)?;
    let IdempotencyKey(key) = key?;
    if key.is_none() && targets.iter().any(|(_, ns)| ns.require_idempotency_key) {
        return Err(ApiError::new(
            ErrorCode::IdempotencyKeyRequired,
            "a channel's namespace requires an Idempotency-Key header",
        ));
    }
    if crate::api::scheduled::asked(deliver_at, delay_ms) {
        let ask = crate::api::scheduled::ScheduleAsk {
            scope: &scope,
            key: key.as_deref(),
            targets,
            data,
            meta,
            deliver_at,
            delay_ms,
            batch: true,
        };
        return crate::api::scheduled::schedule(&state, ask).await;
    }
    for (channel, ns) in &targets {
        if ns.room && state.engine.room(channel).await?.is_none() {
            return Err(crate::rooms::no_such_room());
        }
    }
    let names: Vec<ChannelName> = targets.iter().map(|(c, _)| c.clone()).collect();
    let fp = fingerprint(&names, &data, meta.as_ref());
    let scoped = key.as_ref().map(|k| ScopedKey::new(&scope, k));
    let _claim = match &scoped {
        Some(s) => Some(state.in_flight.claim(&s.anchor())?),
        None => None,
    };
    let message = |i: usize| {
        let channel = &targets[i].0;
        let dedup = scoped.as_ref().map(|s| {
            let key = if i == 0 { s.anchor() } else { s.for_channel(channel) };
            (key, fp)
        });
        Publish { channel: channel.clone(), data: data.clone(), meta: meta.clone(), dedup }
    };
    let publish = |i: usize| state.publish_claimed(targets[i].1, message(i));
    // The channels go to the engine as one submission (one group commit).
    let publish_all =
        |from: usize| state.publish_many((from..targets.len()).map(|i| Ok(message(i))).collect(), false);
    // With a key, the first channel goes first: a mismatch there (another
    // request under this key) appends nothing anywhere, and any other
    // failure there leaves the rest to the retry.
    let mut outcomes = Vec::with_capacity(targets.len());
    if scoped.is_some() {
        let first = publish(0).await;
        let skipped = first.as_ref().err().map(|e| {
            ApiError::new(e.code, format!("not attempted: the batch's first channel failed ({})", e.detail))
        });
        outcomes.push(first);
        match skipped {
            None => outcomes.extend(publish_all(1).await),
            Some(e) => outcomes.extend((1..targets.len()).map(|_| Err(e.clone()))),
        }
    } else {
        outcomes.extend(publish_all(0).await);
    }

    let mut results = Vec::with_capacity(outcomes.len());
    let mut first_error: Option<ApiError> = None;
    let mut all_replayed = true;
    for ((channel, _), outcome) in targets.iter().zip(&outcomes) {
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
            Ok(json_response(publish_status(durable), &BatchReply { results }, all_replayed))
        }
        Some(err) => {
            // Problem document plus the per-channel outcome, so the caller
            // knows what landed; a retry with the same key completes the rest.
            let problem =
                BatchProblem { problem: herald_proto::Problem::new(err.code, err.detail.clone()), results };
            let mut resp = err.into_response();
            *resp.body_mut() = axum::body::Body::from(serde_json::to_vec(&problem).expect("serialises"));
            Ok(resp)
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
    let max = state.config.limits.max_history_limit;
    let limit = q.limit.unwrap_or(100.min(max));
    if limit == 0 || limit > max {
        return Err(ApiError::new(ErrorCode::BadRequest, format!("`limit` must be 1..={max}")));
    }
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

/// Most cursors one receipts or inbox request returns.
const MAX_CURSORS: usize = 10_000;

fn cursor_limit(q: Result<Q<LimitQuery>, ApiError>) -> Result<usize, ApiError> {
    let Q(q) = q?;
    let limit = q.limit.unwrap_or(1000);
    if limit == 0 || limit > MAX_CURSORS {
        return Err(ApiError::new(ErrorCode::BadRequest, format!("`limit` must be 1..={MAX_CURSORS}")));
    }
    Ok(limit)
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
        if state.config.namespaces.resolve(&own).is_ok_and(|ns| ns.delivery == herald_core::Delivery::Acked) {
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

pub async fn healthz() -> &'static str {
    "ok\n"
}

pub async fn readyz(State(state): St) -> Result<&'static str, ApiError> {
    if state.shutdown.is_cancelled() {
        return Err(ApiError::new(ErrorCode::ShuttingDown, "shutting down"));
    }
    match state.engine.health() {
        Health::Ready => Ok("ready\n"),
        Health::Unavailable(why) | Health::Failed(why) => {
            Err(ApiError::new(ErrorCode::Unavailable, format!("storage not ready: {why}")))
        }
    }
}

pub async fn metrics(State(state): St) -> Response {
    (
        [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
        state.metrics.render(),
    )
        .into_response()
}

pub async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such endpoint")
}

/// The path exists, not with this method (axum adds `Allow`).
pub async fn method_not_allowed() -> ApiError {
    ApiError::new(ErrorCode::MethodNotAllowed, "this endpoint does not take this method")
}
