//! The server-wide byte ceiling: [`QueuedBytes`] counts the bytes of every
//! frame queued for delivery on this server, each once, and refuses a
//! [`Charge`] that would pass `websocket.total_outbox_bytes`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use prometheus_client::metrics::gauge::Gauge;

/// Bytes of frames queued for delivery on this server, each frame counted
/// once: in outboxes, in the batches sessions are writing, in the catch-up
/// pages they hold. The count is the `herald_outbox_bytes` gauge itself.
pub struct QueuedBytes {
    gauge: Gauge,
    ceiling: i64,
}

impl QueuedBytes {
    pub fn new(gauge: Gauge, ceiling: usize) -> Self {
        Self { gauge, ceiling: i64::try_from(ceiling).unwrap_or(i64::MAX) }
    }

    /// Charge `len` bytes if the total stays within the ceiling.
    pub fn try_charge(self: &Arc<Self>, len: usize) -> Option<Charge> {
        let n = i64::try_from(len).ok()?;
        self.gauge
            .inner()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| (t + n <= self.ceiling).then_some(t + n))
            .ok()?;
        Some(Charge { queued: self.clone(), len: n })
    }

    /// Bytes that can still be charged (a snapshot).
    pub fn room(&self) -> usize {
        usize::try_from(self.ceiling - self.gauge.get()).unwrap_or(0)
    }

    /// The ceiling, in bytes.
    pub fn ceiling(&self) -> usize {
        usize::try_from(self.ceiling).unwrap_or(usize::MAX)
    }

    /// Bytes charged (a snapshot).
    pub fn total(&self) -> usize {
        usize::try_from(self.gauge.get()).unwrap_or(0)
    }
}

/// Bytes held against the server's ceiling; released on drop.
pub struct Charge {
    queued: Arc<QueuedBytes>,
    len: i64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.queued.gauge.dec_by(self.len);
    }
}
