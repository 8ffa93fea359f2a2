//! `GET /sse`: a Server-Sent Events stream of the channels the query names
//! (docs/sse.md). The same checks as a WebSocket upgrade come first
//! (shutdown and drain, the page's `Origin`, the token, the session cap);
//! then the channels are subscribed, each after its position in the
//! browser's `Last-Event-ID` (or the query's `since`, or `from=first`),
//! and only then is the stream answered (200, `text/event-stream`), so
//! anything refused is an HTTP status with a problem document. A session
//! task (`gateway::session`, wire `wire/sse.rs`) writes the stream.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use herald_proto::{ChannelName, ErrorCode, Since};

use crate::error::ApiError;
use crate::gateway::listener::Streaming;
use crate::gateway::session::{sse_pipe, Session, Socket, Wire};
use crate::gateway::wire::sse::{self, Conn};
use crate::gateway::ws::{forwarded_for, identify, precheck, ConnSlot};
use crate::state::AppState;

/// What the query of `GET /sse` says.
#[derive(Default)]
struct SseQuery {
    channels: Vec<ChannelName>,
    token: Option<String>,
    user: Option<String>,
    device: Option<String>,
    /// Positions in the id's encoding, where a first connection starts.
    since: Option<String>,
    /// `from=first`: every channel from its first retained message.
    from_first: bool,
}

pub async fn stream(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let (req, _) = req.into_parts();
    match open(&state, &req).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

async fn open(state: &Arc<AppState>, req: &Parts) -> Result<Response, ApiError> {
    if !state.config().sse.enabled {
        return Err(ApiError::new(ErrorCode::NotFound, "Server-Sent Events are off (sse.enabled)"));
    }
    let headers = &req.headers;
    precheck(state, headers)?;
    let q = parse_query(req.uri.query().unwrap_or(""), state.config().sse.max_channels)?;
    let identity =
        identify(state, headers, q.token.as_deref(), q.user.as_deref(), q.device.as_deref()).await?;
    // A banned user or a revoked token gets a problem, as before an upgrade.
    crate::gateway::session::admit(state, &identity).await?;
    let starts = starts(state, headers, &q).await?;
    let Some(slot) = ConnSlot::acquire(state) else {
        state.metrics.connections_rejected.inc();
        let mut e = ApiError::new(ErrorCode::TooManyConnections, "server is at its connection limit");
        e.retry_after = Some(5);
        return Err(e);
    };
    let conn_id = state.next_conn_id.fetch_add(1, Ordering::Relaxed);
    let (writer, body) = sse_pipe(&sse::retry(state.config().sse.retry.as_millis()));
    let wire = Wire::Sse(Box::new(Conn::new(q.channels)));
    let remote = forwarded_for(headers);
    let mut session = Session::new(state.clone(), Socket::Sse(writer), identity, conn_id, wire, remote);
    session.start_sse(starts).await?;
    state.tasks.spawn(async move {
        let _slot = slot;
        session.run().await;
    });
    let mut resp = (StatusCode::OK, Body::new(body)).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // nginx buffers proxied responses unless told not to.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    // A page on another origin that passed the Origin check may read it.
    if let Some(origin) = headers.get(header::ORIGIN) {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
        h.insert(header::ACCESS_CONTROL_ALLOW_CREDENTIALS, HeaderValue::from_static("true"));
        h.insert(header::VARY, HeaderValue::from_static("Origin"));
    }
    resp.extensions_mut().insert(Streaming);
    Ok(resp)
}

fn bad_request(detail: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::BadRequest, detail)
}

fn parse_query(query: &str, max_channels: usize) -> Result<SseQuery, ApiError> {
    let mut q = SseQuery::default();
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        match &*key {
            "channel" => {
                let channel = ChannelName::new(&value)
                    .map_err(|e| ApiError::new(ErrorCode::BadChannel, format!("`channel` {value:?}: {e}")))?;
                if q.channels.contains(&channel) {
                    return Err(bad_request(format!("channel {channel} is named twice")));
                }
                q.channels.push(channel);
            }
            "token" => q.token = Some(value.into_owned()),
            "user" => q.user = Some(value.into_owned()),
            "device" => q.device = Some(value.into_owned()),
            "since" => q.since = Some(value.into_owned()),
            "from" if value == "first" => q.from_first = true,
            "from" => return Err(bad_request("`from` takes `first` only")),
            // Anything else (a cache buster, say) is not ours.
            _ => {}
        }
    }
    if q.channels.is_empty() {
        return Err(bad_request("name at least one `channel`"));
    }
    if q.channels.len() > max_channels {
        return Err(bad_request(format!("at most {max_channels} channels per stream (sse.max_channels)")));
    }
    if q.since.is_some() && q.from_first {
        return Err(bad_request("`since` and `from` exclude each other"));
    }
    Ok(q)
}

/// Where each channel starts: after the positions of `Last-Event-ID` (the
/// browser's reconnect), else of `since`, else from the first retained
/// message (`from=first`), else as a subscribe without `since`.
async fn starts(state: &AppState, headers: &HeaderMap, q: &SseQuery) -> Result<Vec<Option<Since>>, ApiError> {
    let n = q.channels.len();
    let last = headers.get("last-event-id").map(|v| v.to_str().unwrap_or("\u{0}")).filter(|v| !v.is_empty());
    if let Some(last) = last {
        return Conn::parse_positions(last, n).map_err(|e| bad_request(format!("Last-Event-ID {e}")));
    }
    if let Some(since) = &q.since {
        return Conn::parse_positions(since, n).map_err(|e| bad_request(format!("`since` {e}")));
    }
    let mut starts = vec![None; n];
    if q.from_first {
        for (start, channel) in starts.iter_mut().zip(&q.channels) {
            if state.config().namespaces.resolve(channel)?.is_durable() {
                let pos = state.engine.position(channel).await?;
                *start = Some(Since { seq: pos.first.saturating_sub(1), epoch: Some(pos.epoch.to_string()) });
            }
        }
    }
    Ok(starts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_names_channels_in_order_and_refuses_what_cannot_work() {
        let q = parse_query("channel=a%3A1&channel=b:2&token=t&_=9", 4).unwrap();
        assert_eq!(q.channels.iter().map(|c| c.as_str()).collect::<Vec<_>>(), ["a:1", "b:2"]);
        assert_eq!(q.token.as_deref(), Some("t"));
        let code = |r: Result<SseQuery, ApiError>| r.err().map(|e| e.code);
        assert_eq!(code(parse_query("", 4)), Some(ErrorCode::BadRequest));
        assert_eq!(code(parse_query("channel=a:1&channel=a:1", 4)), Some(ErrorCode::BadRequest));
        assert_eq!(code(parse_query("channel=a:1&channel=b:1", 1)), Some(ErrorCode::BadRequest));
        assert_eq!(code(parse_query("channel=bad%20name", 4)), Some(ErrorCode::BadChannel));
        assert_eq!(code(parse_query("channel=a:1&from=last", 4)), Some(ErrorCode::BadRequest));
        assert_eq!(code(parse_query("channel=a:1&from=first&since=1", 4)), Some(ErrorCode::BadRequest));
    }
}
