//! A mergeable latency histogram in microseconds.
//!
//! Log-linear buckets: values below 256 µs are exact, above that each power
//! of two is cut into 128 buckets, so a reported percentile is within 0.8 %
//! of the true value. Workers send theirs to the parent as sparse
//! `(bucket, count)` pairs, and the parent merges them.

use serde::{Deserialize, Serialize};

const EXACT: u64 = 256;
const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;
const BUCKETS: usize = (EXACT + (64 - 8) * SUB) as usize;

#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum: u128,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self { counts: vec![0; BUCKETS], total: 0, sum: 0, max: 0 }
    }
}

fn index(v: u64) -> usize {
    if v < EXACT {
        return v as usize;
    }
    let e = 63 - v.leading_zeros() as u64; // >= 8
    let shift = e - (SUB_BITS as u64);
    let mantissa = (v >> shift) - SUB; // 0..SUB
    (EXACT + (e - 8) * SUB + mantissa) as usize
}

/// The middle of a bucket.
fn value(idx: usize) -> u64 {
    let idx = idx as u64;
    if idx < EXACT {
        return idx;
    }
    let e = 8 + (idx - EXACT) / SUB;
    let m = SUB + (idx - EXACT) % SUB;
    let shift = e - (SUB_BITS as u64);
    let low = m << shift;
    low + ((1u64 << shift) - 1) / 2
}

impl Histogram {
    pub fn record(&mut self, micros: u64) {
        self.counts[index(micros)] += 1;
        self.total += 1;
        self.sum += u128::from(micros);
        self.max = self.max.max(micros);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
        self.sum += other.sum;
        self.max = self.max.max(other.max);
    }

    /// The value at quantile `q` (0..=1), in microseconds; `None` if empty.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (idx, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(value(idx).min(self.max));
            }
        }
        Some(self.max)
    }

    /// Quantile in milliseconds, rounded to microseconds.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        self.quantile(q).map(|us| us as f64 / 1000.0)
    }

    pub fn mean_ms(&self) -> Option<f64> {
        (self.total > 0).then(|| self.sum as f64 / self.total as f64 / 1000.0)
    }

    pub fn max_ms(&self) -> Option<f64> {
        (self.total > 0).then(|| self.max as f64 / 1000.0)
    }

    pub fn to_wire(&self) -> WireHistogram {
        let buckets =
            self.counts.iter().enumerate().filter(|(_, &c)| c > 0).map(|(i, &c)| (i as u32, c)).collect();
        WireHistogram { buckets, sum: self.sum as f64, max: self.max }
    }

    pub fn from_wire(w: &WireHistogram) -> Histogram {
        let mut h = Histogram::default();
        for &(i, c) in &w.buckets {
            if let Some(slot) = h.counts.get_mut(i as usize) {
                *slot += c;
                h.total += c;
            }
        }
        h.sum = w.sum as u128;
        h.max = w.max;
        h
    }
}

/// Sparse form for the worker → parent pipe.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireHistogram {
    pub buckets: Vec<(u32, u64)>,
    pub sum: f64,
    pub max: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for v in [0, 1, 255, 256, 257, 1000, 4095, 4096, 1 << 20, 123_456_789, u64::MAX / 2] {
            let idx = index(v);
            assert!(idx >= last, "index({v}) went backwards");
            last = idx;
            let mid = value(idx);
            let err = mid.abs_diff(v) as f64 / (v.max(1)) as f64;
            assert!(err < 0.008, "value {v} → {mid}: error {err}");
        }
        assert!(index(u64::MAX) < BUCKETS);
    }

    #[test]
    fn quantiles_and_merge() {
        let mut a = Histogram::default();
        for v in 1..=1000 {
            a.record(v);
        }
        assert_eq!(a.quantile(0.5), Some(500).map(|v| value(index(v))));
        let p99 = a.quantile(0.99).unwrap();
        assert!((985..=995).contains(&p99), "{p99}");
        let mut b = Histogram::from_wire(&a.to_wire());
        b.merge(&a);
        assert_eq!(b.count(), 2000);
        assert_eq!(b.quantile(1.0), Some(1000));
        assert!(Histogram::default().quantile(0.5).is_none());
    }
}
