//! What the parent and its worker processes say to each other: one JSON
//! object per line, the spec and then commands on the worker's stdin,
//! events on its stdout.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::hist::WireHistogram;
use crate::protocol::Endpoint;

/// Everything a worker needs, sent as the first line of its stdin.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerSpec {
    pub endpoint: Endpoint,
    /// Source address of every connection of this worker.
    pub source: Option<Ipv4Addr>,
    /// Makes user and channel names unique to the run.
    pub run_id: String,
    /// Global index of this worker's first connection.
    pub first: usize,
    pub count: usize,
    pub layout: Layout,
    /// Reconnect and resume after an unexpected disconnect.
    pub resume: bool,
    pub connect_concurrency: usize,
    /// Deadline of the connect phase, and of each reconnect.
    pub phase_timeout_ms: u64,
    /// The worker exits on its own after this, whatever happens.
    pub lifetime_ms: u64,
}

/// Which channel each connection subscribes to.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Layout {
    /// Every connection on one channel.
    Shared { channel: String },
    /// Connection `i` on `{prefix}{user i}` (e.g. `user:` + its user name).
    PerUser { prefix: String },
}

impl WorkerSpec {
    /// The user name of global connection `i`.
    pub fn user(run_id: &str, i: usize) -> String {
        format!("{run_id}-{i}")
    }

    pub fn channel(layout: &Layout, run_id: &str, i: usize) -> String {
        match layout {
            Layout::Shared { channel } => channel.clone(),
            Layout::PerUser { prefix } => format!("{prefix}{}", Self::user(run_id, i)),
        }
    }
}

/// Parent → worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Command {
    /// Wait until every subscription received every `n < target_n` (and,
    /// with `wait_acks`, acked all it received) or the timeout, then report
    /// the period and start a new one.
    Collect { target_n: u64, wait_acks: bool, timeout_ms: u64 },
    /// Every connection drops its socket at a random moment within
    /// `window_ms`, waits up to `pause_ms`, reconnects and resumes; report
    /// when all are back (or the timeout).
    Drop { window_ms: u64, pause_ms: u64, timeout_ms: u64 },
    /// Close everything and exit.
    Stop,
}

/// Worker → parent.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    Ready {
        connected: u64,
        failed: u64,
        errors: Vec<String>,
        /// Attempts that failed and were retried.
        retried: u64,
        retry_error: Option<String>,
    },
    Collected {
        tally: crate::tally::Tally,
    },
    Reconnected {
        tally: ReconnectTally,
    },
    Stopped,
}

/// Outcome of one drop-and-reconnect round of a worker.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReconnectTally {
    pub dropped: u64,
    pub resumed: u64,
    pub failed: u64,
    /// Wall clock (µs) of the last successful resume.
    pub last_resumed_us: Option<u64>,
    /// Connect + upgrade + subscribe time of each resume (after the pause).
    pub handshake: WireHistogram,
    pub errors: Vec<String>,
}

impl ReconnectTally {
    pub fn merge(&mut self, o: &ReconnectTally) {
        self.dropped += o.dropped;
        self.resumed += o.resumed;
        self.failed += o.failed;
        self.last_resumed_us = self.last_resumed_us.max(o.last_resumed_us);
        let mut h = crate::hist::Histogram::from_wire(&self.handshake);
        h.merge(&crate::hist::Histogram::from_wire(&o.handshake));
        self.handshake = h.to_wire();
        for e in &o.errors {
            if self.errors.len() < crate::tally::MAX_ERRORS {
                self.errors.push(e.clone());
            }
        }
    }
}
