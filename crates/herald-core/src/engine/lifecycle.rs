//! Readiness, the engine's own figures, and the orderly stop.

use async_trait::async_trait;

use super::EngineMetric;

/// Engine readiness, for `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Ready,
    /// Temporarily unable to serve (for example Redis unreachable).
    Unavailable(String),
    /// Fail-stop after a storage error: refuses writes until restarted.
    Failed(String),
}

/// What the server asks of an engine beside its data: readiness for
/// `/readyz`, figures for `/metrics`, and the last step of the shutdown
/// (after every connection and request is done).
#[async_trait]
pub trait Lifecycle: Send + Sync + 'static {
    /// Whether the engine takes writes now.
    fn health(&self) -> Health;

    /// The engine's own counters and gauges, read on every `/metrics`
    /// scrape (cheap: relaxed atomics).
    fn metrics(&self) -> Vec<EngineMetric> {
        Vec::new()
    }

    /// Flush and stop. Appends after this fail with `ShuttingDown`.
    async fn close(&self);
}
