//! The one mapping from failures to HTTP responses (problem+json) and
//! WebSocket error frames.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use herald_core::EngineError;
use herald_proto::{ErrorCode, ErrorFrame, Problem};

/// A wire-visible failure: a stable code plus a human detail.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: ErrorCode,
    pub detail: String,
    /// Seconds, sent as `Retry-After` on 503.
    pub retry_after: Option<u64>,
    /// The resource's current state (problem+json `current`), for 409/412
    /// on rooms.
    pub current: Option<Box<serde_json::Value>>,
}

impl ApiError {
    pub fn new(code: ErrorCode, detail: impl Into<String>) -> Self {
        Self { code, detail: detail.into(), retry_after: None, current: None }
    }

    pub fn with_current(mut self, current: serde_json::Value) -> Self {
        self.current = Some(Box::new(current));
        self
    }

    pub fn frame(&self, req: Option<u64>, channel: Option<&str>) -> Vec<u8> {
        ErrorFrame { req, code: self.code, message: self.detail.clone(), channel: channel.map(str::to_owned) }
            .encode()
    }
}

impl From<herald_core::UnknownNamespace> for ApiError {
    fn from(e: herald_core::UnknownNamespace) -> Self {
        ApiError::new(ErrorCode::UnknownNamespace, e.to_string())
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::IdempotencyMismatch => ApiError::new(
                ErrorCode::IdempotencyKeyReused,
                "this Idempotency-Key was used with a different request",
            ),
            // A failure reported by the engine may come after the write
            // reached storage, so the outcome is unknown: never claim that
            // nothing was stored. A retry with the same Idempotency-Key has
            // exactly one effect either way.
            EngineError::Unavailable(_) => ApiError {
                code: ErrorCode::Unavailable,
                detail: "storage is unavailable; retry with the same Idempotency-Key".into(),
                retry_after: Some(1),
                current: None,
            },
            EngineError::Failed(_) => ApiError {
                code: ErrorCode::Unavailable,
                detail: "storage has failed and refuses writes until restarted; retry with the same Idempotency-Key"
                    .into(),
                retry_after: Some(5),
                current: None,
            },
            EngineError::ShuttingDown => ApiError {
                code: ErrorCode::ShuttingDown,
                detail: "server is shutting down; nothing was stored".into(),
                retry_after: Some(1),
                current: None,
            },
            EngineError::Closed => {
                ApiError::new(ErrorCode::ChannelClosed, "the channel is closed (a closed room); nothing was stored")
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut problem = Problem::new(self.code, self.detail);
        problem.current = self.current.map(|c| *c);
        let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&problem).expect("problem serialises");
        let mut resp = (status, body).into_response();
        resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if let Some(secs) = self.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// The body of a request did not arrive within `http.body_read_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within http.body_read_timeout")]
pub(crate) struct BodyTimeout;

/// Whether `T` is in the chain of `e` and its sources: a body read that
/// failed because of [`BodyTimeout`], or stopped at the size limit
/// (`http_body_util::LengthLimitError`).
pub(crate) fn caused_by<T: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.is::<T>() {
            return true;
        }
        cur = err.source();
    }
    false
}
