//! Request bodies: refused at once when their declared length is above the
//! limit, and given one deadline for the whole body.
//!
//! tower-http's `RequestBodyTimeoutLayer` restarts its clock on every frame,
//! so a client trickling a byte every few seconds would keep a request (and
//! its connection, which is busy and never evicted) open for days; here the
//! deadline is fixed when the headers are complete.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::http::{header, Request};
use axum::response::{IntoResponse, Response};
use futures_util::future::{ready, Either, Ready};
use herald_proto::ErrorCode;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

use crate::error::{ApiError, BodyTimeout};
use crate::metrics::Metrics;
use crate::state::AppState;

/// The guard around the whole router (one service per connection, applied
/// once per request, not per route): 413 before reading a body whose
/// `Content-Length` is above `http.max_body_bytes` (a chunked body is cut
/// at the limit while it is read, see `api::extract::Body`), then the body
/// deadline.
#[derive(Clone)]
pub(crate) struct Guard<S> {
    inner: S,
    state: Arc<AppState>,
}

impl<S> Guard<S> {
    pub(crate) fn new(inner: S, state: Arc<AppState>) -> Self {
        Self { inner, state }
    }
}

impl<S> tower_service::Service<Request<Incoming>> for Guard<S>
where
    S: tower_service::Service<Request<Body>, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<Ready<Result<Response, Infallible>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let http = &self.state.config().http;
        let limit = http.max_body_bytes;
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            let refused = ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!("request body is larger than {limit} bytes"),
            )
            .into_response();
            return Either::Left(ready(Ok(refused)));
        }
        let req = if req.body().is_end_stream() {
            req.map(Body::new)
        } else {
            let deadline = Instant::now() + http.body_read_timeout;
            let metrics = self.state.metrics.clone();
            req.map(|body| Body::new(Deadline { body, deadline, sleep: None, metrics, expired: false }))
        };
        Either::Right(self.inner.call(req))
    }
}

/// A body that fails with [`BodyTimeout`] if it has not ended by `deadline`.
struct Deadline {
    body: Incoming,
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
            return Poll::Ready(frame.map(|f| f.map_err(axum::Error::new)));
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
