//! The HTTP API (`/api/v1`) and operations endpoints.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State as AxState};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use herald_core::{Health, NamespaceOptions, Receipt};
use herald_proto::{
    check_id, BatchBody, BodyError, ChannelName, ErrorCode, HistoryPage, PublishBody, StoredFrame,
};
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::publish::{fingerprint, validate_idempotency_key, Publish, ScopedKey};
use crate::State;

type St = AxState<Arc<State>>;

/// Check `Authorization: Bearer <api key>`; returns the idempotency scope.
pub(crate) fn api_auth(state: &State, headers: &HeaderMap) -> Result<String, ApiError> {
    let bearer = crate::auth::bearer(headers);
    match bearer {
        Some(key) => state
            .api_keys
            .check(key.trim())
            .map(|scope| format!("api:{scope}"))
            .ok_or_else(|| ApiError::new(ErrorCode::Unauthorized, "unknown API key")),
        None if state.config.dev => Ok("api:dev".to_owned()),
        None if state.api_keys.is_empty() => Err(ApiError::new(
            ErrorCode::Unauthorized,
            "no API keys are configured: set api_keys in the config or HERALD_API_KEYS (or run with --dev)",
        )),
        None => Err(ApiError::new(ErrorCode::Unauthorized, "missing `Authorization: Bearer <api key>`")),
    }
}

pub(crate) fn parse_channel<'a>(
    state: &'a State,
    name: &str,
) -> Result<(ChannelName, &'a NamespaceOptions), ApiError> {
    let channel = ChannelName::new(name).map_err(|e| ApiError::new(ErrorCode::BadChannel, e.to_string()))?;
    let ns = state.config.namespaces.resolve(&channel)?;
    Ok((channel, ns))
}

pub(crate) fn body_bytes(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(ErrorCode::PayloadTooLarge, format!("request body is larger than {limit} bytes"))
        } else if crate::listener::body::is_body_timeout(&e) {
            ApiError::new(ErrorCode::RequestTimeout, "the request body did not arrive in time")
        } else {
            ApiError::new(ErrorCode::BadRequest, format!("could not read the body: {e}"))
        }
    })
}

pub(crate) fn parse_json<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, ApiError> {
    herald_proto::parse_json(bytes).map_err(body_error)
}

fn body_error(e: BodyError) -> ApiError {
    ApiError::new(e.code, e.message)
}

/// The `Idempotency-Key` header. A key names one request: two headers are a
/// malformed request (400), never "the first wins".
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut values = headers.get_all("idempotency-key").iter();
    let Some(v) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(ApiError::new(
            ErrorCode::IdempotencyKeyInvalid,
            "more than one Idempotency-Key header: send exactly one",
        ));
    }
    let key = v.to_str().map_err(|_| {
        ApiError::new(ErrorCode::IdempotencyKeyInvalid, "Idempotency-Key must be printable ASCII")
    })?;
    validate_idempotency_key(key)?;
    Ok(Some(key.to_owned()))
}

#[derive(Serialize)]
struct PublishResult<'a> {
    channel: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    seq: Option<u64>,
    id: &'a str,
    epoch: &'a str,
}

impl<'a> From<&'a Receipt> for PublishResult<'a> {
    fn from(r: &'a Receipt) -> Self {
        Self { channel: r.channel.as_str(), seq: r.seq, id: &r.id, epoch: r.epoch.as_str() }
    }
}

fn json_response(status: StatusCode, body: &impl Serialize, replayed: bool) -> Response {
    let bytes = serde_json::to_vec(body).expect("response serialises");
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
    AxState(state): St,
    Path(channel): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let scope = api_auth(&state, &headers)?;
    let (channel, ns) = parse_channel(&state, &channel)?;
    let body = body_bytes(body, state.config.limits.max_body_bytes)?;
    let PublishBody { data, meta, deliver_at, delay_ms } = PublishBody::parse(&body).map_err(body_error)?;
    let key = idempotency_key(&headers)?;
    if key.is_none() && ns.require_idempotency_key {
        return Err(ApiError::new(
            ErrorCode::IdempotencyKeyRequired,
            format!("namespace `{}` requires an Idempotency-Key header", channel.namespace()),
        ));
    }
    if crate::http_scheduled::asked(deliver_at, delay_ms) {
        let ask = crate::http_scheduled::ScheduleAsk {
            scope: &scope,
            key: key.as_deref(),
            targets: vec![(channel, ns)],
            data,
            meta,
            deliver_at,
            delay_ms,
            batch: false,
        };
        return crate::http_scheduled::schedule(&state, ask).await;
    }
    // The same comparison as a batch of one: see `publish::fingerprint`.
    let dedup = key.map(|k| {
        let fp = fingerprint(std::slice::from_ref(&channel), &data, meta.as_ref());
        (ScopedKey::new(&scope, &k).anchor(), fp)
    });
    let receipt = state.publish(ns, Publish { channel, data, meta, dedup }).await?;
    Ok(json_response(publish_status(ns.is_durable()), &PublishResult::from(&receipt), receipt.duplicate))
}

/// `POST /api/v1/publish`: one message to several channels. With an
/// Idempotency-Key the batch is one request under the key (see
/// `publish::ScopedKey`): its first channel's append decides whether it is
/// new, a replay or a mismatch, before any other channel is appended; each
/// other channel's append is deduplicated on its own, so a retry of a partly
/// failed batch completes it without doubling any channel.
pub async fn publish_batch(
    AxState(state): St,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let scope = api_auth(&state, &headers)?;
    let body = body_bytes(body, state.config.limits.max_body_bytes)?;
    let BatchBody { channels, data, meta, deliver_at, delay_ms } =
        BatchBody::parse(&body).map_err(body_error)?;
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
    let key = idempotency_key(&headers)?;
    if key.is_none() && targets.iter().any(|(_, ns)| ns.require_idempotency_key) {
        return Err(ApiError::new(
            ErrorCode::IdempotencyKeyRequired,
            "a channel's namespace requires an Idempotency-Key header",
        ));
    }
    if crate::http_scheduled::asked(deliver_at, delay_ms) {
        let ask = crate::http_scheduled::ScheduleAsk {
            scope: &scope,
            key: key.as_deref(),
            targets,
            data,
            meta,
            deliver_at,
            delay_ms,
            batch: true,
        };
        return crate::http_scheduled::schedule(&state, ask).await;
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
                results.push(serde_json::to_value(PublishResult::from(r)).expect("serialises"));
            }
            Err(e) => {
                first_error.get_or_insert_with(|| e.clone());
                results.push(serde_json::json!({
                    "channel": channel.as_str(),
                    "error": {"code": e.code.as_str(), "detail": e.detail},
                }));
            }
        }
    }
    match first_error {
        None => {
            let durable = targets.iter().any(|(_, ns)| ns.is_durable());
            Ok(json_response(
                publish_status(durable),
                &serde_json::json!({ "results": results }),
                all_replayed,
            ))
        }
        Some(err) => {
            // Problem document plus the per-channel outcome, so the caller
            // knows what landed; a retry with the same key completes the rest.
            let mut problem = serde_json::to_value(herald_proto::Problem::new(err.code, err.detail.clone()))
                .expect("serialises");
            problem["results"] = serde_json::Value::Array(results);
            let mut resp = err.into_response();
            *resp.body_mut() = axum::body::Body::from(serde_json::to_vec(&problem).expect("serialises"));
            Ok(resp)
        }
    }
}

#[derive(Deserialize)]
pub struct HistoryQuery {
    #[serde(default)]
    after: u64,
    #[serde(default)]
    limit: Option<usize>,
}

/// `GET /api/v1/channels/{channel}/messages?after=SEQ&limit=N`
pub async fn history(
    AxState(state): St,
    Path(channel): Path<String>,
    query: Result<Query<HistoryQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    api_auth(&state, &headers)?;
    let (channel, ns) = parse_channel(&state, &channel)?;
    let Query(q) = query.map_err(|e| ApiError::new(ErrorCode::BadRequest, e.body_text()))?;
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

#[derive(Deserialize)]
pub struct LimitQuery {
    #[serde(default)]
    limit: Option<usize>,
}

/// Most cursors one receipts or inbox request returns.
const MAX_CURSORS: usize = 10_000;

fn cursor_limit(
    q: Result<Query<LimitQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<usize, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::new(ErrorCode::BadRequest, e.body_text()))?;
    let limit = q.limit.unwrap_or(1000);
    if limit == 0 || limit > MAX_CURSORS {
        return Err(ApiError::new(ErrorCode::BadRequest, format!("`limit` must be 1..={MAX_CURSORS}")));
    }
    Ok(limit)
}

/// `GET /api/v1/channels/{channel}/cursors`: delivery receipts of an acked
/// channel: every subscriber's cursor, unread count and last ack time.
pub async fn cursors(
    AxState(state): St,
    Path(channel): Path<String>,
    query: Result<Query<LimitQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    api_auth(&state, &headers)?;
    let (channel, ns) = parse_channel(&state, &channel)?;
    let limit = cursor_limit(query)?;
    if ns.delivery != herald_core::Delivery::Acked {
        return Err(ApiError::new(
            ErrorCode::NotSupported,
            "cursors exist only on channels with delivery = \"acked\"",
        ));
    }
    let pos = state.engine.position(&channel).await?;
    let list = state.engine.cursors(&channel, limit).await?;
    let cursors: Vec<_> = list
        .iter()
        .map(|(sub, c)| {
            serde_json::json!({
                "user": sub.user(),
                "device": sub.device(),
                "cursor": c.seq,
                "unread": pos.head.saturating_sub(c.seq),
                "acked_at": c.acked_at_ms,
            })
        })
        .collect();
    let body = serde_json::json!({
        "channel": channel.as_str(),
        "epoch": pos.epoch.as_str(),
        "first": pos.first,
        "head": pos.head,
        "cursors": cursors,
    });
    Ok(json_response(StatusCode::OK, &body, false))
}

/// `GET /api/v1/users/{user}/inbox`: for each acked channel of the user (its
/// `user:{user}` channel and every channel it has a cursor on): head, cursor
/// per device, unread.
pub async fn inbox(
    AxState(state): St,
    Path(user): Path<String>,
    query: Result<Query<LimitQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    api_auth(&state, &headers)?;
    let limit = cursor_limit(query)?;
    check_id(&user).map_err(|e| ApiError::new(ErrorCode::BadRequest, format!("`user` {e}")))?;
    let mut by_channel: std::collections::BTreeMap<ChannelName, Vec<serde_json::Value>> = Default::default();
    if let Ok(own) = ChannelName::new(&format!("user:{user}")) {
        if state.config.namespaces.resolve(&own).is_ok_and(|ns| ns.delivery == herald_core::Delivery::Acked) {
            by_channel.entry(own).or_default();
        }
    }
    let list = state.engine.user_cursors(&user, limit).await?;
    for uc in &list {
        by_channel.entry(uc.channel.clone()).or_default().push(serde_json::json!({
            "device": uc.device.as_deref(),
            "cursor": uc.cursor.seq,
            "acked_at": uc.cursor.acked_at_ms,
        }));
    }
    let mut channels = Vec::with_capacity(by_channel.len());
    for (channel, mut devices) in by_channel {
        let pos = state.engine.position(&channel).await?;
        for d in &mut devices {
            let cursor = d["cursor"].as_u64().unwrap_or(0);
            d["unread"] = pos.head.saturating_sub(cursor).into();
        }
        // A device that never acked has everything retained unread.
        let unread_new_device = pos.head + 1 - pos.first;
        channels.push(serde_json::json!({
            "channel": channel.as_str(),
            "epoch": pos.epoch.as_str(),
            "first": pos.first,
            "head": pos.head,
            "unread_without_cursor": unread_new_device,
            "devices": devices,
        }));
    }
    Ok(json_response(StatusCode::OK, &serde_json::json!({ "user": user, "channels": channels }), false))
}

pub async fn healthz() -> &'static str {
    "ok\n"
}

pub async fn readyz(AxState(state): St) -> Result<&'static str, ApiError> {
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

pub async fn metrics(AxState(state): St) -> Response {
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
