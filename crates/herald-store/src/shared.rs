//! State shared by the engine handle, the writer thread and readers.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use herald_core::{EngineError, FanoutSink};
use tokio::sync::watch;

use crate::stats::Counters;
use crate::storage::Storage;

pub(crate) struct Shared {
    pub storage: Storage,
    sink: RwLock<Option<Arc<dyn FanoutSink>>>,
    /// Set once, on the first storage error: the engine is fail-stopped.
    failure: OnceLock<String>,
    /// `close` was called: new appends are refused.
    closing: AtomicBool,
    /// The writer thread has finished (its last batch is persisted).
    writer_done: watch::Sender<bool>,
    pub counters: Counters,
    pub clock: Clock,
    /// Schedules stored (counted at open, kept by the writer after each
    /// commit).
    schedules_pending: AtomicI64,
    /// Claims of schedules (`schedules.rs`).
    pub claims: crate::schedules::ClaimBook,
    /// Where scans of the due index start (`schedules.rs`, `DueFloor`).
    pub due_floor: crate::schedules::DueFloor,
}

impl Shared {
    pub fn new(storage: Storage) -> Self {
        Self {
            storage,
            sink: RwLock::new(None),
            failure: OnceLock::new(),
            closing: AtomicBool::new(false),
            writer_done: watch::Sender::new(false),
            counters: Counters::default(),
            clock: Clock::default(),
            schedules_pending: AtomicI64::new(0),
            claims: Default::default(),
            due_floor: Default::default(),
        }
    }

    pub fn add_schedules_pending(&self, delta: i64) {
        if delta != 0 {
            self.schedules_pending.fetch_add(delta, Ordering::Relaxed);
        }
    }

    pub fn schedules_pending(&self) -> u64 {
        u64::try_from(self.schedules_pending.load(Ordering::Relaxed)).unwrap_or(0)
    }

    pub fn set_sink(&self, sink: Arc<dyn FanoutSink>) {
        // A poisoned lock only means a panic elsewhere while replacing an
        // `Option<Arc>`; the value is still whole.
        *self.sink.write().unwrap_or_else(|e| e.into_inner()) = Some(sink);
    }

    pub fn sink(&self) -> Option<Arc<dyn FanoutSink>> {
        self.sink.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Enter fail-stop (first reason wins) and return the reason in force.
    pub fn fail(&self, reason: String) -> String {
        if self.failure.set(reason.clone()).is_ok() {
            tracing::error!(%reason, "embedded store failed; refusing writes until restarted");
        }
        self.failure.get().cloned().unwrap_or(reason)
    }

    pub fn failure(&self) -> Option<&str> {
        self.failure.get().map(String::as_str)
    }

    pub fn begin_close(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    pub fn mark_writer_done(&self) {
        self.writer_done.send_replace(true);
    }

    pub async fn writer_finished(&self) {
        let mut rx = self.writer_done.subscribe();
        // The sender lives in `self`, so `wait_for` cannot see it dropped.
        let _ = rx.wait_for(|done| *done).await;
    }

    /// What a request gets when the writer is gone or going.
    pub fn stopped_error(&self) -> EngineError {
        match self.failure() {
            Some(reason) => EngineError::Failed(reason.to_owned()),
            None => EngineError::ShuttingDown,
        }
    }
}

/// The engine's time: wall-clock ms, never going backwards within a run, so
/// each channel's log is ordered by `ts` too (the age sweeper relies on it),
/// and readers never count a lease as live that the writer already treats
/// as expired. Shared by the writer and the readers.
#[derive(Default)]
pub(crate) struct Clock {
    last_ms: AtomicU64,
}

impl Clock {
    pub fn now_ms(&self) -> u64 {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        self.last_ms.fetch_max(wall, Ordering::Relaxed).max(wall)
    }
}
