//! The web console: one page, built with the TypeScript client, served at
//! `/console/` from files embedded in the binary (no CDN, no Node at build
//! time: `crates/herald-server/console/` holds the built client bundle, and
//! CI checks that rebuilding it from `clients/typescript/src` gives the same
//! bytes).
//!
//! Served when `console` is `on`, or `auto` (the default) with `--dev`.
//! The files are the same public code in every Herald binary and hold no
//! data; everything the page shows comes from the API with the credentials
//! the person typed into it: outside dev mode the API key (sent by the page
//! as `Authorization: Bearer`, checked by `/console/session` and by every
//! API call) and, for the WebSocket, a user token (JWT). Same origin only:
//! the page's Content-Security-Policy lets it talk to this server alone.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use herald_proto::ErrorCode;

use crate::api::extract::ApiKey;
use crate::error::ApiError;
use crate::state::AppState;

/// The embedded files: name, content type, bytes.
const FILES: &[(&str, &str, &[u8])] = &[
    ("index.html", "text/html; charset=utf-8", include_bytes!("../../console/index.html")),
    ("console.css", "text/css; charset=utf-8", include_bytes!("../../console/console.css")),
    ("console.js", "text/javascript; charset=utf-8", include_bytes!("../../console/console.js")),
    ("herald-client.js", "text/javascript; charset=utf-8", include_bytes!("../../console/herald-client.js")),
];

/// The page may load its own files and talk to this origin (HTTP API and
/// WebSocket), nothing else; it may not be framed.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The console's routes. Each handler answers 404 while the console is off,
/// so the router does not depend on the configuration.
pub(crate) fn router() -> Router<Arc<AppState>> {
    Router::new()
        .route("/console", get(|| async { Redirect::permanent("/console/") }))
        .route("/console/", get(|st: State<Arc<AppState>>| file(st, Path("index.html".to_owned()))))
        .route("/console/session", get(session))
        .route("/console/{file}", get(file))
}

fn enabled(state: &AppState) -> Result<(), ApiError> {
    if state.config().console_enabled() {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorCode::NotFound,
            "the console is off (set `console = \"on\"` or run with --dev)",
        ))
    }
}

async fn file(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Response, ApiError> {
    enabled(&state)?;
    let Some((_, content_type, bytes)) = FILES.iter().find(|(n, _, _)| *n == name) else {
        return Err(ApiError::new(ErrorCode::NotFound, "no such console file"));
    };
    let mut resp = (StatusCode::OK, *bytes).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // The files change with the binary: always revalidate.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    Ok(resp)
}

/// `GET /console/session`: what the page must ask for. Outside dev mode it
/// needs the API key (so the page can check the key it was given); in dev
/// mode it answers without one.
async fn session(
    State(state): State<Arc<AppState>>,
    key: Result<ApiKey, ApiError>,
) -> Result<Response, ApiError> {
    enabled(&state)?;
    key?;
    let body = serde_json::json!({
        "dev": state.config().dev,
        "jwt": state.jwt.load().is_configured(),
        "version": env!("CARGO_PKG_VERSION"),
    });
    let mut resp = (StatusCode::OK, body.to_string()).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}
