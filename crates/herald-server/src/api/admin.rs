//! The operator's actions on this node: `POST /api/v1/admin/drain` and
//! `POST /api/v1/admin/reload`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;

use super::{json_response, St};
use crate::api::extract::ApiKey;
use crate::error::ApiError;
use crate::state::AppState;
use herald_proto::ErrorCode;

/// The answer to a drain request.
#[derive(Serialize)]
struct Draining {
    /// Always true: the node is draining (now, or since an earlier call).
    draining: bool,
    /// Whether this call began it.
    started: bool,
    /// The period the sessions are closed over, in ms.
    drain_period_ms: u64,
}

/// Drain this node the way SIGTERM begins a shutdown, without the shutdown:
/// `/readyz` answers 503 at once, new WebSocket connections are refused
/// (503), and the open ones are closed one by one over
/// `shutdown.drain_period` with 4010 (reconnect elsewhere now). HTTP keeps
/// serving. Idempotent; it cannot be undone short of a restart.
pub async fn drain(State(state): St, ApiKey(scope): ApiKey) -> Result<Response, ApiError> {
    let started = !state.sessions.is_draining();
    let period = state.config().shutdown.drain_period;
    if started {
        tracing::info!(scope, "drain requested through the API");
        tokio::spawn(run(state.clone()));
    }
    let body = Draining { draining: true, started, drain_period_ms: period.as_millis() as u64 };
    Ok(json_response(StatusCode::ACCEPTED, &body, false))
}

/// Drain the node's sessions over `shutdown.drain_period`, bounded by
/// `shutdown.grace` (see `hub::Sessions::drain`).
pub(crate) async fn run(state: Arc<AppState>) {
    let s = &state.config().shutdown;
    state.sessions.drain(s.drain_period, s.grace).await;
}

/// Read the configuration again and apply what can change live (see
/// `crate::reload`), as SIGHUP does. `200 {"changed": [keys]}`; refused,
/// nothing changed: `409 conflict` with the reason (the error a start
/// would print, or the keys that need a restart).
pub async fn reload(State(state): St, ApiKey(scope): ApiKey) -> Result<Response, ApiError> {
    tracing::info!(scope, "reload requested through the API");
    // Reading the file is blocking I/O; a JWKS source may be fetched too.
    let outcome = tokio::task::spawn_blocking(move || state.reload())
        .await
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("reload: {e}")))?;
    match outcome {
        Ok(reloaded) => Ok(json_response(StatusCode::OK, &reloaded, false)),
        Err(e) => Err(ApiError::new(ErrorCode::Conflict, e.to_string())),
    }
}
