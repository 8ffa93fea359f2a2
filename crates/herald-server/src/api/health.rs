//! Operations endpoints (`/healthz`, `/readyz`, `/metrics`) and the
//! answers to requests no route takes.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use herald_core::Health;
use herald_proto::ErrorCode;

use super::St;
use crate::error::ApiError;

pub async fn healthz() -> &'static str {
    "ok\n"
}

pub async fn readyz(State(state): St) -> Result<&'static str, ApiError> {
    if state.shutdown.is_cancelled() {
        return Err(ApiError::new(ErrorCode::ShuttingDown, "shutting down"));
    }
    if state.sessions.is_draining() {
        return Err(ApiError::new(ErrorCode::ShuttingDown, "draining: send new connections elsewhere"));
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
