//! `GET /connection/websocket`: the upgrade to the Centrifugo client
//! protocol (v2), on its JSON or Protobuf wire (negotiated here).
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

/// The upgrade's query: `user` (dev mode, a `connect` without token),
/// `device` (as on `/ws`; a token's `device` claim wins), and the wire:
/// `format` or `cf_protocol` = `protobuf` (else JSON).
#[derive(Deserialize)]
pub struct UpgradeQuery {
    user: Option<String>,
    device: Option<String>,
    format: Option<String>,
    cf_protocol: Option<String>,
}

/// The subprotocols of the centrifuge SDKs, one per wire.
const PROTOBUF: &str = "centrifuge-protobuf";
const JSON: &str = "centrifuge-json";

/// The wire a client asks for: Protobuf by the query (`format` or
/// `cf_protocol`) or by offering the `centrifuge-protobuf` subprotocol;
/// and the subprotocol to echo in the 101, the one the client offered for
/// that wire (none if it offered none).
fn negotiate(q: &UpgradeQuery, headers: &http::HeaderMap) -> (bool, Option<&'static str>) {
    let offered = |name: &str| {
        headers
            .get_all(http::header::SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|p| p.trim().eq_ignore_ascii_case(name))
    };
    let by_query = [&q.format, &q.cf_protocol].into_iter().flatten().any(|f| f == "protobuf");
    let protobuf = by_query || offered(PROTOBUF);
    let echo = if protobuf { PROTOBUF } else { JSON };
    (protobuf, offered(echo).then_some(echo))
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
    let headers = state.config().proxies.connect.is_some().then(|| Box::new(req.headers().clone()));
    let (protobuf, echo) = negotiate(&q, req.headers());
    let conn = Box::new(Conn::new(q.user, q.device, headers));
    let wire = if protobuf { Wire::CentrifugoProtobuf(conn) } else { Wire::CentrifugoJson(conn) };
    let mut response = crate::gateway::ws::start_session(state, req, nobody, wire);
    if let Some(echo) = echo.filter(|_| response.status() == http::StatusCode::SWITCHING_PROTOCOLS) {
        response
            .headers_mut()
            .insert(http::header::SEC_WEBSOCKET_PROTOCOL, http::HeaderValue::from_static(echo));
    }
    response
}
