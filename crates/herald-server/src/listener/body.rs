//! Request bodies: refused at once when their declared length is above the
//! limit, and given one deadline for the whole body.
//!
//! tower-http's `RequestBodyTimeoutLayer` restarts its clock on every frame,
//! so a client trickling a byte every few seconds would keep a request (and
//! its connection, which is busy and never evicted) open for days; here the
//! deadline is fixed when the headers are complete.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use herald_proto::ErrorCode;
use http_body::{Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::AppState;

/// The body of a request did not arrive within `limits.body_read_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within limits.body_read_timeout")]
pub(crate) struct BodyTimeout;

/// Whether a body read failed because of [`BodyTimeout`].
pub(crate) fn is_body_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.is::<BodyTimeout>() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Middleware: 413 before reading a body whose `Content-Length` is above
/// `limits.max_body_bytes` (a chunked body is cut at the limit while it is
/// read), then the body deadline.
pub(crate) async fn guard(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let limit = state.config.limits.max_body_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("request body is larger than {limit} bytes"),
        )
        .into_response();
    }
    if req.body().is_end_stream() {
        return next.run(req).await;
    }
    let deadline = Instant::now() + state.config.limits.body_read_timeout;
    let metrics = state.metrics.clone();
    let req = req.map(|body| Body::new(Deadline { body, deadline, sleep: None, metrics, expired: false }));
    next.run(req).await
}

/// A body that fails with [`BodyTimeout`] if it has not ended by `deadline`.
struct Deadline {
    body: Body,
    deadline: Instant,
    /// Created on the first wait: a body that is already there needs none.
    sleep: Option<Pin<Box<Sleep>>>,
    metrics: Arc<Metrics>,
    expired: bool,
}

impl HttpBody for Deadline {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        if this.expired {
            return Poll::Ready(Some(Err(axum::Error::new(BodyTimeout))));
        }
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        let deadline = this.deadline;
        let sleep = this.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        this.expired = true;
        this.metrics.http_dropped("body_timeout");
        Poll::Ready(Some(Err(axum::Error::new(BodyTimeout))))
    }

    fn is_end_stream(&self) -> bool {
        !self.expired && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
