//! The HTTP API (`/api/v1`) and operations endpoints.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State as AxState};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use herald_core::{Health, NamespaceOptions, Receipt};
use herald_proto::{validate_meta, ChannelName, ErrorCode, MessageView, Meta};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::error::ApiError;
use crate::publish::{fingerprint, scoped_key, validate_idempotency_key, Publish};
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
    serde_json::from_slice(bytes).map_err(|e| {
        let code = if e.is_syntax() || e.is_eof() { ErrorCode::BadJson } else { ErrorCode::BadRequest };
        ApiError::new(code, format!("invalid body: {e}"))
    })
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    match headers.get("idempotency-key") {
        None => Ok(None),
        Some(v) => {
            let key = v.to_str().map_err(|_| {
                ApiError::new(ErrorCode::IdempotencyKeyInvalid, "Idempotency-Key must be printable ASCII")
            })?;
            validate_idempotency_key(key)?;
            Ok(Some(key.to_owned()))
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PublishBody {
    data: Box<RawValue>,
    #[serde(default)]
    meta: Option<Meta>,
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
    let PublishBody { data, meta } = parse_json(&body)?;
    if let Some(meta) = &meta {
        validate_meta(meta).map_err(|m| ApiError::new(ErrorCode::BadRequest, m))?;
    }
    let key = idempotency_key(&headers)?;
    if key.is_none() && ns.require_idempotency_key {
        return Err(ApiError::new(
            ErrorCode::IdempotencyKeyRequired,
            format!("namespace `{}` requires an Idempotency-Key header", channel.namespace()),
        ));
    }
    let dedup = key.map(|k| {
        let fp = fingerprint("publish", std::slice::from_ref(&channel), &data, meta.as_ref());
        (scoped_key(&scope, &k, None), fp)
    });
    let receipt = state.publish(ns, Publish { channel, data, meta, dedup }).await?;
    Ok(json_response(publish_status(ns.is_durable()), &PublishResult::from(&receipt), receipt.duplicate))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchBody {
    channels: Vec<String>,
    data: Box<RawValue>,
    #[serde(default)]
    meta: Option<Meta>,
}

/// `POST /api/v1/publish`: one message to several channels. With an
/// Idempotency-Key each channel's append is deduplicated on its own key, so a
/// retry of a partly failed batch completes it without doubling any channel.
pub async fn publish_batch(
    AxState(state): St,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let scope = api_auth(&state, &headers)?;
    let body = body_bytes(body, state.config.limits.max_body_bytes)?;
    let BatchBody { channels, data, meta } = parse_json(&body)?;
    if channels.is_empty() || channels.len() > state.config.limits.max_batch_channels {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            format!("`channels` must name 1..={} channels", state.config.limits.max_batch_channels),
        ));
    }
    if let Some(meta) = &meta {
        validate_meta(meta).map_err(|m| ApiError::new(ErrorCode::BadRequest, m))?;
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
    let key = idempotency_key(&headers)?;
    if key.is_none() && targets.iter().any(|(_, ns)| ns.require_idempotency_key) {
        return Err(ApiError::new(
            ErrorCode::IdempotencyKeyRequired,
            "a channel's namespace requires an Idempotency-Key header",
        ));
    }
    let names: Vec<ChannelName> = targets.iter().map(|(c, _)| c.clone()).collect();
    let fp = fingerprint("batch", &names, &data, meta.as_ref());
    let appends = targets.iter().map(|(channel, ns)| {
        let dedup = key.as_ref().map(|k| (scoped_key(&scope, k, Some(channel)), fp));
        let p = Publish { channel: channel.clone(), data: data.clone(), meta: meta.clone(), dedup };
        state.publish(ns, p)
    });
    let outcomes = futures_util::future::join_all(appends).await;

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

#[derive(Serialize)]
struct HistoryMessage {
    /// `message`, or `room` for a room's state changes.
    #[serde(rename = "type")]
    kind: String,
    seq: Option<u64>,
    id: Option<String>,
    ts: Option<u64>,
    data: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    meta: Option<Meta>,
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
    let mut messages = Vec::with_capacity(page.messages.len());
    for m in &page.messages {
        let v = MessageView::parse(&m.frame)
            .map_err(|e| ApiError::new(ErrorCode::Internal, format!("stored frame unreadable: {e}")))?;
        messages.push(HistoryMessage {
            kind: v.kind,
            seq: v.seq,
            id: v.id,
            ts: v.ts,
            data: v.data,
            meta: v.meta,
        });
    }
    let body = serde_json::json!({
        "channel": channel.as_str(),
        "epoch": page.position.epoch.as_str(),
        "first": page.position.first,
        "head": page.position.head,
        "messages": messages,
    });
    Ok(json_response(StatusCode::OK, &body, false))
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
    if user.is_empty() || user.len() > 255 || user.chars().any(char::is_control) {
        return Err(ApiError::new(ErrorCode::BadRequest, "`user` must be 1..=255 printable characters"));
    }
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
