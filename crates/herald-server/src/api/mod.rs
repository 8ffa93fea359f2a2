//! The HTTP API: one module per resource (`messages`: publish and
//! history; `batch`: many messages in one request; `cursors`: delivery receipts; `rooms`: rooms and presence;
//! `scheduled`; `webhooks` and `consumers`: their status and the
//! operator's actions;
//! `health`: operations endpoints; `admin`: the operator's actions on the
//! node; `users`: the backend's actions on users, on every node; `nodes`:
//! the active channels and the nodes of the deployment), the typed extractors that check a
//! request before its handler runs (`extract`), and the web console.
//! Errors are [`ApiError`](crate::ApiError)s, mapped once in `error.rs`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::state::AppState;

pub(crate) mod admin;
pub(crate) mod batch;
pub(crate) mod console;
pub(crate) mod consumers;
pub(crate) mod cursors;
pub(crate) mod extract;
pub(crate) mod health;
pub(crate) mod messages;
pub(crate) mod nodes;
pub(crate) mod rooms;
pub(crate) mod scheduled;
pub(crate) mod users;
pub(crate) mod webhooks;

/// The state every handler takes.
type St = State<Arc<AppState>>;

/// A JSON reply; `replayed` marks an answer from an idempotency receipt
/// (`Idempotent-Replayed: true`).
fn json_response(status: StatusCode, body: &impl Serialize, replayed: bool) -> Response {
    json_bytes_response(status, serde_json::to_vec(body).expect("response serialises"), replayed)
}

/// [`json_response`] for a body encoded already.
fn json_bytes_response(status: StatusCode, bytes: Vec<u8>, replayed: bool) -> Response {
    let mut resp = (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], bytes)
        .into_response();
    if replayed {
        resp.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    resp
}
