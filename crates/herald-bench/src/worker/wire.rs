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
    /// The nodes of the cluster under test (one for a single server):
    /// connection `i` opens on [`node_for`]`(i, endpoints.len(), hops)`.
    pub endpoints: Vec<Endpoint>,
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
    /// Wait a random time below this before such a resume, as client SDKs
    /// do, so the clients of a lost node do not all come back at once.
    #[serde(default)]
    pub resume_jitter_ms: u64,
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
    /// Where global connection `i` opens after `hops` moves.
    pub fn endpoint(&self, i: usize, hops: usize) -> &Endpoint {
        &self.endpoints[node_for(i, self.endpoints.len(), hops)]
    }

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

/// The node (index into `nodes`) of global connection `i` after it moved
/// `hops` times. At first (`hops == 0`) connections are spread round-robin:
/// `i % nodes`. A connection that lost its node moves on and never comes
/// back to it while it keeps moving: move `h` goes to one of the other
/// `nodes - 1`, chosen by `i / nodes` so the clients of one lost node
/// spread evenly over the rest instead of all landing on its neighbour.
pub fn node_for(i: usize, nodes: usize, hops: usize) -> usize {
    let home = i % nodes.max(1);
    if hops == 0 || nodes <= 1 {
        return home;
    }
    let others = nodes - 1;
    (home + 1 + (i / nodes + hops - 1) % others) % nodes
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

#[cfg(test)]
mod tests {
    use super::node_for;

    #[test]
    fn connections_start_round_robin_over_the_nodes() {
        let homes: Vec<usize> = (0..8).map(|i| node_for(i, 4, 0)).collect();
        assert_eq!(homes, [0, 1, 2, 3, 0, 1, 2, 3]);
        assert_eq!(node_for(7, 1, 0), 0);
        assert_eq!(node_for(7, 1, 5), 0);
    }

    #[test]
    fn a_lost_nodes_clients_spread_over_the_others_and_never_return() {
        let nodes = 8;
        let lost = 3;
        let mut landed = vec![0usize; nodes];
        for i in (lost..80_000).step_by(nodes) {
            for hops in 1..2 * nodes {
                assert_ne!(node_for(i, nodes, hops), lost, "connection {i}, move {hops}");
            }
            landed[node_for(i, nodes, 1)] += 1;
        }
        // 10,000 clients over the 7 others: 1,428 or 1,429 each.
        assert_eq!(landed[lost], 0);
        for (n, &c) in landed.iter().enumerate().filter(|&(n, _)| n != lost) {
            assert!((1428..=1429).contains(&c), "node {n} got {c}");
        }
    }

    #[test]
    fn moving_again_visits_every_other_node() {
        let nodes = 5;
        for i in 0..20 {
            let mut seen: Vec<usize> = (1..nodes).map(|h| node_for(i, nodes, h)).collect();
            seen.sort_unstable();
            let mut want: Vec<usize> = (0..nodes).filter(|&n| n != i % nodes).collect();
            want.sort_unstable();
            assert_eq!(seen, want, "connection {i}");
        }
    }
}
