//! The client frame budget of one connection, the 4009 rule, and the cap on
//! `error` replies.
//!
//! - Frames: `rate_limits.client_frames_per_sec` per second, burst of the same
//!   size. A frame over it is refused (an `error` `rate_limited` reply, the
//!   frame dropped). Acks that move the acked window are free; every other
//!   ack (repeated, not delivered yet, not subscribed...) costs one frame.
//! - Close: refusals are counted over a sliding window of
//!   `rate_limits.close_window` (in ten slots). When the count exceeds
//!   `rate_limits.close_percent` of the budget of that window
//!   (`rate × window × percent / 100`), the connection is closed with 4009.
//!   A client that keeps sending at `1 + percent/100` times its budget or
//!   more is closed within about one window; one that overshoots in bursts
//!   is not.
//! - Errors: at most `rate_limits.error_replies_per_sec` `error` frames per
//!   second, burst of the same size; the rest are dropped (and counted), so
//!   replies never outnumber what the budgets allow, whatever the client
//!   sends.
//!
//! Pure: every call takes the current instant.

use std::time::{Duration, Instant};

use crate::config::RateLimitConfig;

/// Slots of the refusal window.
const SLOTS: usize = 10;

pub(super) struct Budget {
    frames: Bucket,
    errors: Bucket,
    /// Created on the first refusal: a well-behaved connection never pays
    /// for it.
    refused: Option<Box<Window>>,
}

impl Budget {
    pub fn new(rate_limits: &RateLimitConfig, now: Instant) -> Self {
        Self {
            frames: Bucket::full(rate_limits.client_frames_per_sec, now),
            errors: Bucket::full(rate_limits.error_replies_per_sec, now),
            refused: None,
        }
    }

    /// Spend one frame of the budget; `false`: refused.
    pub fn take_frame(&mut self, rate_limits: &RateLimitConfig, now: Instant) -> bool {
        self.frames.take(rate_limits.client_frames_per_sec, now)
    }

    /// Count a refused frame; `true` when the connection must be closed
    /// (4009): refusals over the window exceed the close threshold.
    pub fn refuse(&mut self, rate_limits: &RateLimitConfig, now: Instant) -> bool {
        let window = self.refused.get_or_insert_with(|| Box::new(Window::new(now)));
        window.add(now, rate_limits.close_window) > close_threshold(rate_limits)
    }

    /// Whether an `error` frame may be sent now (and spend it).
    pub fn take_error_reply(&mut self, rate_limits: &RateLimitConfig, now: Instant) -> bool {
        self.errors.take(rate_limits.error_replies_per_sec, now)
    }
}

/// Refusals over one window above which the connection is closed.
pub(super) fn close_threshold(rate_limits: &RateLimitConfig) -> u64 {
    let budget = f64::from(rate_limits.client_frames_per_sec) * rate_limits.close_window.as_secs_f64();
    (budget * f64::from(rate_limits.close_percent) / 100.0) as u64
}

/// A token bucket: `rate` per second, burst of `rate`.
struct Bucket {
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn full(rate: u32, now: Instant) -> Self {
        Self { tokens: f64::from(rate), last: now }
    }

    fn take(&mut self, rate: u32, now: Instant) -> bool {
        let refill = now.saturating_duration_since(self.last).as_secs_f64() * f64::from(rate);
        self.last = now;
        self.tokens = (self.tokens + refill).min(f64::from(rate));
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Events over a sliding window, counted in `SLOTS` slots of a tenth of it:
/// the count covers the last nine full slots and the current one.
struct Window {
    origin: Instant,
    /// Number of the newest slot since `origin`.
    newest: u64,
    slots: [u32; SLOTS],
}

impl Window {
    fn new(now: Instant) -> Self {
        Self { origin: now, newest: 0, slots: [0; SLOTS] }
    }

    /// Count one event at `now`; returns the events in the window.
    fn add(&mut self, now: Instant, window: Duration) -> u64 {
        let slot_len = (window / SLOTS as u32).as_nanos().max(1);
        let slot = (now.saturating_duration_since(self.origin).as_nanos() / slot_len) as u64;
        if slot > self.newest {
            // Clear the slots that fell out of the window.
            for s in (self.newest + 1)..=slot.min(self.newest + SLOTS as u64) {
                self.slots[(s % SLOTS as u64) as usize] = 0;
            }
            self.newest = slot;
        }
        let i = (self.newest % SLOTS as u64) as usize;
        self.slots[i] = self.slots[i].saturating_add(1);
        self.slots.iter().map(|&n| u64::from(n)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(rate: u32, percent: u32, window_secs: u64) -> RateLimitConfig {
        RateLimitConfig {
            client_frames_per_sec: rate,
            close_percent: percent,
            close_window: Duration::from_secs(window_secs),
            error_replies_per_sec: 5,
        }
    }

    #[test]
    fn a_sustained_flood_closes_within_the_window_a_burst_does_not() {
        let l = limits(100, 50, 10);
        assert_eq!(close_threshold(&l), 500);
        let t0 = Instant::now();
        // 8x the budget: a frame every 1.25 ms, 100 a second accepted.
        let mut b = Budget::new(&l, t0);
        let closed_at = (0..8_000u64)
            .map(|i| t0 + Duration::from_micros(i * 1250))
            .find(|&now| !b.take_frame(&l, now) && b.refuse(&l, now));
        let at = closed_at.expect("a sustained flood is closed").duration_since(t0).as_millis();
        assert!(at < 2_000, "closed after {at} ms, well within the window");

        // A burst of 3x the budget once a minute never reaches the threshold.
        let mut b = Budget::new(&l, t0);
        for minute in 0..10u64 {
            let now = t0 + Duration::from_secs(minute * 60);
            for _ in 0..300 {
                if !b.take_frame(&l, now) {
                    assert!(!b.refuse(&l, now), "a burst is not a sustained excess");
                }
            }
        }
    }

    #[test]
    fn refusals_leave_the_window_as_it_slides() {
        let l = limits(10, 50, 10); // threshold 50
        let t0 = Instant::now();
        let mut b = Budget::new(&l, t0);
        // 45 refusals in the first second...
        for _ in 0..45 {
            assert!(!b.refuse(&l, t0));
        }
        // ...are forgotten eleven seconds later: 45 more stay under 50.
        let later = t0 + Duration::from_secs(11);
        for _ in 0..45 {
            assert!(!b.refuse(&l, later));
        }
        // Within the window they add up.
        assert!((0..10).any(|_| b.refuse(&l, later + Duration::from_secs(1))));
    }

    #[test]
    fn error_replies_are_capped_per_second() {
        let l = limits(10, 50, 10);
        let t0 = Instant::now();
        let mut b = Budget::new(&l, t0);
        let sent = (0..1000).filter(|_| b.take_error_reply(&l, t0)).count();
        assert_eq!(sent, 5, "the burst");
        let t1 = t0 + Duration::from_secs(1);
        let sent = (0..1000).filter(|_| b.take_error_reply(&l, t1)).count();
        assert_eq!(sent, 5, "one second's worth");
    }
}
