//! Trace spans and W3C trace context (docs/configuration.md, "Traces").
//!
//! The server makes its spans with `tracing`, at TRACE level under the
//! target [`TARGET`]: the log filter (`HERALD_LOG`, `info` by default)
//! does not take them, so with traces off their callsites are disabled and
//! cost next to nothing; the binary's OpenTelemetry layer, installed when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set, takes exactly them and exports
//! them over OTLP. Span fields never hold a token, a key or a message body.
//!
//! A request's `traceparent` header (W3C Trace Context) makes its span a
//! child of the caller's; a webhook or proxy request carries the
//! `traceparent` of its own span, so a backend's trace runs through Herald
//! and back.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderValue;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The target of every span the server makes for tracing.
pub const TARGET: &str = "herald::trace";

/// The `traceparent` header of a request, if any (an extractor that copies
/// only that header).
pub struct TraceParent(pub Option<HeaderValue>);

impl<S: Send + Sync> FromRequestParts<S> for TraceParent {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(TraceParent(parts.headers.get("traceparent").cloned()))
    }
}

/// Make `span` a child of the caller's span named by `traceparent` (when
/// the span is recorded and the header is a valid version-00 one; anything
/// else is ignored, as the W3C rules say).
pub fn continue_from(span: &tracing::Span, traceparent: Option<&HeaderValue>) {
    if span.is_disabled() {
        return;
    }
    let Some(remote) = traceparent.and_then(|v| v.to_str().ok()).and_then(parse) else { return };
    let cx = opentelemetry::Context::new().with_remote_span_context(remote);
    let _ = span.set_parent(cx);
}

/// The `traceparent` naming `span`, for an outgoing request; `None` when
/// traces are off.
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    if span.is_disabled() {
        return None;
    }
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| format(&sc))
}

/// `00-{trace id}-{parent id}-{flags}`.
fn parse(v: &str) -> Option<SpanContext> {
    let mut parts = v.trim().split('-');
    let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version != "00" || parts.next().is_some() || trace.len() != 32 || span.len() != 16 || flags.len() != 2
    {
        return None;
    }
    let lower_hex = |s: &str| s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !lower_hex(trace) || !lower_hex(span) || !lower_hex(flags) {
        return None;
    }
    let trace = TraceId::from_hex(trace).ok()?;
    let span = SpanId::from_hex(span).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let sc = SpanContext::new(trace, span, TraceFlags::new(flags & 1), true, TraceState::default());
    sc.is_valid().then_some(sc)
}

fn format(sc: &SpanContext) -> String {
    format!("00-{}-{}-{:02x}", sc.trace_id(), sc.span_id(), sc.trace_flags().to_u8())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips_and_bad_ones_are_ignored() {
        let v = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let sc = parse(v).unwrap();
        assert_eq!(format(&sc), v);
        assert!(sc.is_sampled() && sc.is_remote());
        assert!(
            parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").is_some_and(|s| !s.is_sampled())
        );
        for bad in [
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "garbage",
        ] {
            assert!(parse(bad).is_none(), "{bad}");
        }
    }
}
