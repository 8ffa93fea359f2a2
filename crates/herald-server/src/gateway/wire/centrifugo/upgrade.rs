//! `GET /connection/websocket`: the upgrade to the Centrifugo client
//! protocol (v2, JSON).
//!
//! The upgrade makes the checks of `/ws` that need no credential (shutdown,
//! the page's `Origin`, the connection cap); the token comes in the
//! `connect` command (without one, the connect proxy decides, given the
//! upgrade's headers, as on `/ws`). The socket is then served by the same `Session` as
//! `/ws`, on the Centrifugo wire: same engine,
//! hub, channels, permissions, limits and delivery guarantees.

use std::sync::Arc;

use axum::extract::{Query, Request, State};
use axum::response::{IntoResponse, Response};
use herald_proto::{check_id, ErrorCode};
use serde::Deserialize;

use super::Conn;
use crate::auth::Identity;
use crate::error::ApiError;
use crate::gateway::wire::Wire;
use crate::state::AppState;

/// The upgrade's query: `user` (dev mode, a `connect` without token) and
/// `device` (as on `/ws`; a token's `device` claim wins).
#[derive(Deserialize)]
pub struct UpgradeQuery {
    user: Option<String>,
    device: Option<String>,
}

pub async fn upgrade(
    State(state): State<Arc<AppState>>,
    query: Result<Query<UpgradeQuery>, axum::extract::rejection::QueryRejection>,
    req: Request,
) -> Response {
    if let Err(e) = crate::gateway::ws::precheck(&state, req.headers()) {
        return e.into_response();
    }
    let q = match query {
        Ok(Query(q)) => q,
        Err(e) => return ApiError::new(ErrorCode::BadRequest, e.body_text()).into_response(),
    };
    if let Some(device) = &q.device {
        if let Err(e) = check_id(device) {
            return ApiError::new(ErrorCode::BadRequest, format!("`device` {e}")).into_response();
        }
    }
    // Anonymous until `connect` sets the identity: it may do nothing.
    let nobody = Identity::granted("-", None, &[], &[], None);
    let headers = state.config.proxies.connect.is_some().then(|| Box::new(req.headers().clone()));
    crate::gateway::ws::start_session(
        state,
        req,
        nobody,
        Wire::CentrifugoJson(Box::new(Conn::new(q.user, q.device, headers))),
    )
}
