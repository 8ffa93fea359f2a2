//! [`QueuedLen`]: bytes queued between two tasks, counted against a bound
//! by the side that queues and given back by the side that takes.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes queued. A queue bounded by it refuses what would pass the bound,
/// except into an empty queue: something larger than the bound still gets
/// through alone, so a bound below the largest item never wedges a queue.
#[derive(Debug, Default)]
pub struct QueuedLen(AtomicUsize);

impl QueuedLen {
    pub const fn new() -> Self {
        Self(AtomicUsize::new(0))
    }

    /// Add `len` if the count stays within `limit`, or holds nothing yet.
    pub fn try_add(&self, len: usize, limit: usize) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q == 0 || q + len <= limit).then_some(q + len)
            })
            .is_ok()
    }

    /// Add `len` unconditionally (the caller checked the room).
    pub fn add(&self, len: usize) {
        self.0.fetch_add(len, Ordering::AcqRel);
    }

    pub fn sub(&self, len: usize) {
        self.0.fetch_sub(len, Ordering::AcqRel);
    }

    pub fn get(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::QueuedLen;

    #[test]
    fn refuses_past_the_bound_unless_empty() {
        let q = QueuedLen::new();
        assert!(q.try_add(600, 1_000));
        assert!(q.try_add(400, 1_000), "up to the bound");
        assert!(!q.try_add(1, 1_000));
        assert_eq!(q.get(), 1_000, "a refusal adds nothing");
        q.sub(1_000);
        assert!(q.try_add(5_000, 1_000), "alone, larger than the bound");
        assert!(!q.try_add(1, 1_000));
        q.add(10);
        assert_eq!(q.get(), 5_010);
    }
}
