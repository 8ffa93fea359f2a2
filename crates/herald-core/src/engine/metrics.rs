//! An engine's own figures: [`EngineMetric`], the live [`Counter`], and
//! [`engine_counters!`](crate::engine_counters), which makes an engine's
//! counters, their snapshot and their `/metrics` names from one table.

use std::sync::atomic::{AtomicU64, Ordering};

/// One of an engine's own figures, exported by the server on `/metrics` as
/// `herald_engine_{name}` (counters get `_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineMetric {
    /// snake_case, without prefix or `_total`.
    pub name: &'static str,
    pub help: &'static str,
    pub value: u64,
    /// A gauge (a level, like a queue depth) rather than a counter.
    pub gauge: bool,
}

impl EngineMetric {
    pub const fn counter(name: &'static str, help: &'static str, value: u64) -> Self {
        Self { name, help, value, gauge: false }
    }

    pub const fn gauge(name: &'static str, help: &'static str, value: u64) -> Self {
        Self { name, help, value, gauge: true }
    }
}

/// One live counter of an engine: monotonic since open. Relaxed: each
/// counter is independent and read for reporting only.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Count one.
    #[inline]
    pub fn bump(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// Count `n` (nothing is written for 0).
    #[inline]
    pub fn add(&self, n: u64) {
        if n > 0 {
            self.0.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The count now.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Define an engine's counters once, in one table: each entry is a counter
/// (with its doc), exported on `/metrics` when it has a name and a help
/// text. Generates
/// - the snapshot type, one `u64` field per counter, then per gauge;
/// - the live type, one [`Counter`] per counter, with
///   `snapshot(gauges...)` and `add(&delta)` (adds a snapshot-shaped tally,
///   for an engine that counts a batch before it commits);
/// - `metrics()` on the snapshot: the exported figures, counters in table
///   order, then gauges (levels computed at snapshot time, not stored).
///
/// ```
/// herald_core::engine_counters! {
///     /// A snapshot of the engine's counters.
///     pub struct Stats;
///     /// The live counters.
///     pub struct Counters;
///     counters {
///         /// Durable messages appended.
///         appends => "appends": "Durable messages appended",
///         /// Counted, not exported.
///         volatile,
///     }
///     gauges {
///         /// Requests waiting now.
///         queue_depth => "queue_depth": "Requests waiting",
///     }
/// }
/// let live = Counters::default();
/// live.add(&Stats { appends: 2, ..Stats::default() });
/// live.volatile.bump();
/// let now = live.snapshot(5);
/// assert_eq!((now.appends, now.volatile, now.queue_depth), (2, 1, 5));
/// let names: Vec<_> = now.metrics().iter().map(|m| (m.name, m.gauge)).collect();
/// assert_eq!(names, [("appends", false), ("queue_depth", true)]);
/// ```
#[macro_export]
macro_rules! engine_counters {
    (
        $(#[$stats_meta:meta])*
        $stats_vis:vis struct $Stats:ident;
        $(#[$live_meta:meta])*
        $live_vis:vis struct $Live:ident;
        counters {
            $(
                $(#[$meta:meta])*
                $field:ident $(=> $name:literal : $help:literal)?
            ),* $(,)?
        }
        $(gauges {
            $(
                $(#[$gauge_meta:meta])*
                $gauge:ident => $gauge_name:literal : $gauge_help:literal
            ),* $(,)?
        })?
    ) => {
        $(#[$stats_meta])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        $stats_vis struct $Stats {
            $( $(#[$meta])* pub $field: u64, )*
            $($( $(#[$gauge_meta])* pub $gauge: u64, )*)?
        }

        $(#[$live_meta])*
        #[derive(Default)]
        $live_vis struct $Live {
            $( pub $field: $crate::engine::Counter, )*
        }

        impl $Live {
            /// Every counter now, with the gauges given.
            pub fn snapshot(&self $($(, $gauge: u64)*)?) -> $Stats {
                $Stats {
                    $( $field: self.$field.get(), )*
                    $($( $gauge, )*)?
                }
            }

            /// Add every counter of `delta` (its gauges are ignored).
            #[allow(dead_code)]
            pub fn add(&self, delta: &$Stats) {
                $( self.$field.add(delta.$field); )*
            }
        }

        impl $Stats {
            /// The figures exported on `/metrics`: the named counters in
            /// table order, then the gauges.
            pub fn metrics(&self) -> ::std::vec::Vec<$crate::EngineMetric> {
                #[allow(unused_mut)]
                let mut out = ::std::vec::Vec::new();
                $($( out.push($crate::EngineMetric::counter($name, $help, self.$field)); )?)*
                $($( out.push($crate::EngineMetric::gauge($gauge_name, $gauge_help, self.$gauge)); )*)?
                out
            }
        }
    };
}
