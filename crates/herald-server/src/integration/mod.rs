//! Backend integration: webhooks (the server delivers channels to a
//! backend), outbox consumers (the server publishes what a backend
//! committed to its database or stream) and proxies (the server asks a
//! backend before it acts).

pub mod consumers;
pub mod proxies;
pub mod webhooks;

use std::sync::atomic::{AtomicU64, Ordering};

/// A fencing token for work held on a single-node engine (webhook
/// channels, consumer partitions): grows across restarts (wall clock) and
/// within the process, one sequence for every holder.
pub(crate) fn local_token() -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = crate::rooms::now_ms();
    let mut prev = LAST.load(Ordering::Relaxed);
    loop {
        let next = now.max(prev + 1);
        match LAST.compare_exchange_weak(prev, next, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(p) => prev = p,
        }
    }
}
