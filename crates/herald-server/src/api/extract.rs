//! The HTTP handler preamble as typed axum extractors: every `/api/v1`
//! handler names what it needs in its signature ([`ApiKey`], [`Chan`],
//! [`RoomChan`], [`Body`], [`IdempotencyKey`], [`Q`]) and gets it checked,
//! or the request is refused with a problem document carrying the stable
//! code (see [`ApiError`]).
//!
//! Order is behaviour: axum runs extractors in argument order, and the
//! body last. A check that must come after the body (the idempotency key,
//! a query parsed after the channel) is taken as `Result<X, ApiError>` and
//! applied with `?` where the handler wants it, so which error a request
//! with several faults gets stays the same.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use herald_core::NamespaceOptions;
use herald_proto::{BodyError, ChannelName, ErrorCode, RequestBody};
use serde::de::DeserializeOwned;

use crate::error::{caused_by, ApiError, BodyTimeout};
use crate::publish::validate_idempotency_key;
use crate::state::AppState;

/// `Authorization: Bearer <api key>` checked; holds the idempotency scope
/// (`api:<key name>`, or `api:dev` in dev mode without a key).
pub struct ApiKey(pub String);

impl FromRequestParts<Arc<AppState>> for ApiKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, ApiError> {
        api_auth(state, &parts.headers).map(ApiKey)
    }
}

/// The `{channel}` path segment: a valid channel name in a configured
/// namespace, with that namespace's options.
pub struct Chan {
    pub channel: ChannelName,
    pub ns: NamespaceOptions,
}

impl FromRequestParts<Arc<AppState>> for Chan {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Response> {
        let Path(name) =
            Path::<String>::from_request_parts(parts, state).await.map_err(|e| e.into_response())?;
        let (channel, ns) = parse_channel(state, &name).map_err(|e| e.into_response())?;
        Ok(Chan { channel, ns: ns.clone() })
    }
}

/// The `{room}` path segment: a [`Chan`] whose namespace has rooms.
pub struct RoomChan(pub Chan);

impl FromRequestParts<Arc<AppState>> for RoomChan {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Response> {
        let chan = Chan::from_request_parts(parts, state).await?;
        if !chan.ns.room {
            return Err(ApiError::new(
                ErrorCode::NotSupported,
                format!("namespace `{}` is not a room namespace (room = true)", chan.channel.namespace()),
            )
            .into_response());
        }
        Ok(RoomChan(chan))
    }
}

/// A request body read whole (within `http.max_body_bytes` and the body
/// deadline) and parsed as the wire type `T`.
pub struct Body<T>(pub T);

impl<T: RequestBody> FromRequest<Arc<AppState>> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        // Read within our limit here (no `DefaultBodyLimit` layer: the
        // layers wrap the router once, see `Server::http_service`).
        let limit = state.config().http.max_body_bytes;
        let body = body_bytes(axum::body::to_bytes(req.into_body(), limit).await, limit)?;
        T::parse(&body).map(Body).map_err(body_error)
    }
}

/// The `Idempotency-Key` header, checked (`None` when absent). A key names
/// one request: two headers are a malformed request (400), never "the
/// first wins".
pub struct IdempotencyKey(pub Option<String>);

impl FromRequestParts<Arc<AppState>> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &Arc<AppState>) -> Result<Self, ApiError> {
        idempotency_key(&parts.headers).map(IdempotencyKey)
    }
}

/// A query string as the wire type `T`; a malformed one is `bad_request`.
pub struct Q<T>(pub T);

impl<T: DeserializeOwned + Send> FromRequestParts<Arc<AppState>> for Q<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(q)) => Ok(Q(q)),
            Err(e) => Err(ApiError::new(ErrorCode::BadRequest, e.body_text())),
        }
    }
}

/// Check `Authorization: Bearer <api key>`; returns the idempotency scope.
fn api_auth(state: &AppState, headers: &HeaderMap) -> Result<String, ApiError> {
    let bearer = crate::auth::bearer(headers);
    match bearer {
        Some(key) => state
            .api_keys
            .load()
            .check(key.trim())
            .map(|scope| format!("api:{scope}"))
            .ok_or_else(|| ApiError::new(ErrorCode::Unauthorized, "unknown API key")),
        None if state.config().dev => Ok("api:dev".to_owned()),
        None if state.api_keys.load().is_empty() => Err(ApiError::new(
            ErrorCode::Unauthorized,
            "no API keys are configured: set api_keys in the config or HERALD_API_KEYS (or run with --dev)",
        )),
        None => Err(ApiError::new(ErrorCode::Unauthorized, "missing `Authorization: Bearer <api key>`")),
    }
}

/// A channel name from a request, checked and resolved to its namespace.
pub(crate) fn parse_channel<'a>(
    state: &'a AppState,
    name: &str,
) -> Result<(ChannelName, &'a NamespaceOptions), ApiError> {
    state.resolve_channel(name)
}

/// A `?limit=` of a listing: `default` when absent, refused outside `1..=max`.
pub(crate) fn page_limit(limit: Option<usize>, default: usize, max: usize) -> Result<usize, ApiError> {
    let limit = limit.unwrap_or(default);
    if limit == 0 || limit > max {
        return Err(ApiError::new(ErrorCode::BadRequest, format!("`limit` must be 1..={max}")));
    }
    Ok(limit)
}

/// The body as read within `limit`, its failures mapped to stable codes.
fn body_bytes(body: Result<Bytes, axum::Error>, limit: usize) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if caused_by::<http_body_util::LengthLimitError>(&e) {
            ApiError::new(ErrorCode::PayloadTooLarge, format!("request body is larger than {limit} bytes"))
        } else if caused_by::<BodyTimeout>(&e) {
            ApiError::new(ErrorCode::RequestTimeout, "the request body did not arrive in time")
        } else {
            ApiError::new(ErrorCode::BadRequest, format!("could not read the body: {e}"))
        }
    })
}

fn body_error(e: BodyError) -> ApiError {
    ApiError::new(e.code, e.message)
}

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
