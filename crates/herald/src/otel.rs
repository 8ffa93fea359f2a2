//! OpenTelemetry traces over OTLP (HTTP/protobuf), configured by the
//! standard `OTEL_*` environment variables and off unless
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! is set (and `OTEL_SDK_DISABLED` is not `true`). The SDK reads the rest
//! itself: `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` (default:
//! every trace, or as the caller's `traceparent` says), `OTEL_SERVICE_NAME`
//! (default `herald`) and `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_EXPORTER_OTLP_HEADERS` and `_TIMEOUT`, and the batch processor's
//! `OTEL_BSP_*`. The layer takes only the server's trace spans
//! (`herald_server::trace::TARGET`), whatever `HERALD_LOG` says.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::Layer;

/// The exporter's provider: flushed and shut down on drop (at exit).
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Drop for Traces {
    fn drop(&mut self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("herald: traces not flushed at exit: {e}");
        }
    }
}

/// Whether the environment turns traces on.
fn wanted() -> bool {
    let set = |k: &str| std::env::var(k).is_ok_and(|v| !v.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// The tracing layer that exports the server's spans, and its provider;
/// `None` when traces are off.
pub fn layer<S>() -> Result<Option<(impl Layer<S>, Traces)>, String>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    if !wanted() {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| format!("cannot build the OTLP exporter: {e}"))?;
    let mut resource = Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name("herald");
    }
    let provider =
        SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource.build()).build();
    let tracer = provider.tracer("herald");
    // Only what the spans say: no source location, thread, target or
    // busy/idle attributes, and no OpenTelemetry context activated on each
    // poll (nothing here reads it; `trace.rs` goes through the span).
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_context_activation(false)
        .with_filter(Targets::new().with_target(herald_server::trace::TARGET, tracing::Level::TRACE));
    Ok(Some((layer, Traces { provider })))
}
