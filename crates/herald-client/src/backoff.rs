//! Reconnect delays: exponential backoff with full jitter.

use std::time::Duration;

/// Exponential backoff with full jitter: the delay before reconnect attempt
/// `n` (0-based) is uniform in `[0, min(max, base * 2^n)]`.
///
/// Full jitter spreads a crowd of clients that lost the same server over
/// the whole window instead of having them return in synchronised waves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { base: Duration::from_millis(100), max: Duration::from_secs(10) }
    }
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Self {
        Self { base, max }
    }

    /// Upper bound of the window for attempt `n`: `min(max, base * 2^n)`,
    /// without overflow for any `n`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
        self.base.checked_mul(factor).map_or(self.max, |d| d.min(self.max))
    }

    /// The delay for attempt `n`, with jitter drawn from `rng`.
    pub fn delay(&self, attempt: u32, rng: &mut fastrand::Rng) -> Duration {
        let ceiling = self.ceiling(attempt);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rng.u64(0..=nanos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_doubles_then_caps() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
        let ms: Vec<u128> = (0..10).map(|n| b.ceiling(n).as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000, 10_000]);
        assert_eq!(b.ceiling(u32::MAX), Duration::from_secs(10), "no overflow on huge attempts");
        let huge = Backoff::new(Duration::from_secs(u64::MAX / 2), Duration::MAX);
        assert_eq!(huge.ceiling(40), Duration::MAX, "multiplication overflow saturates at max");
    }

    #[test]
    fn delay_is_full_jitter_within_the_window() {
        let b = Backoff::default();
        let mut rng = fastrand::Rng::with_seed(7);
        for attempt in 0..12 {
            let ceiling = b.ceiling(attempt);
            let samples: Vec<Duration> = (0..500).map(|_| b.delay(attempt, &mut rng)).collect();
            assert!(samples.iter().all(|d| *d <= ceiling));
            // Full jitter: the draws cover the window, low and high ends.
            assert!(samples.iter().any(|d| *d < ceiling / 4), "attempt {attempt}");
            assert!(samples.iter().any(|d| *d > ceiling * 3 / 4), "attempt {attempt}");
        }
    }

    #[test]
    fn zero_base_means_immediate_retry() {
        let b = Backoff::new(Duration::ZERO, Duration::from_secs(1));
        let mut rng = fastrand::Rng::with_seed(1);
        assert_eq!(b.delay(5, &mut rng), Duration::ZERO);
    }
}
