//! One run's figures: a human summary on stdout and one JSON object per
//! run appended to `--json FILE`.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use crate::args::BenchArgs;
use crate::hist::Histogram;
use crate::proc_stats::{CpuSnapshot, Machine};
use crate::redis_info::RedisDelta;
use crate::tally::Tally;

#[derive(Debug, Clone, Serialize)]
pub struct Versions {
    pub bench: &'static str,
    /// Version the server under test reported, when it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
}

/// Cluster-wide figures of one phase (`cluster` in the JSON line).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClusterFigures {
    pub nodes: u64,
    /// Messages published in the phase (presence: joins + leaves).
    pub messages: u64,
    /// Sum of the nodes' `utime + stime` over the phase (the killed node
    /// until its death is not counted).
    pub node_cpu_s: Option<f64>,
    /// Node CPU per delivery, µs (presence: per join or leave).
    pub node_cpu_us_per_delivery: Option<f64>,
    pub redis: RedisDelta,
    pub redis_ops_per_message: Option<f64>,
    /// connect: each node's RSS growth per connection it holds, KB.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rss_per_conn_kb: Vec<f64>,
    /// connect: each node's RSS with every connection open, KB.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rss_kb: Vec<u64>,
    /// p2p: the node killed, from the kill until the last of the clients
    /// that lost their connection was subscribed again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub killed_node: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reconnect_s: Option<f64>,
    /// Redis commands per second over the phase (idle: what the held
    /// connections alone cost it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_commands_per_s: Option<f64>,
    /// presence: joins and leaves per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub churn_per_s: Option<f64>,
}

/// Field names are the JSON contract of `docs/benchmarks.md`: add, never
/// rename. `None` means "does not apply to this scenario".
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: &'static str,
    /// acked: which part of the run (`drain`, `live`); one object each.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<&'static str>,
    pub peer: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    pub run_id: String,
    /// Unix time of the start of the run, seconds.
    pub started_at: u64,
    pub ok: bool,
    pub problems: Vec<String>,
    // parameters
    pub connections: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publishers: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub messages: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// idle, p2p: namespace of the per-user channels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub workers: u64,
    /// fanout, p2p: `http` (one request in flight per publisher) or `ws`
    /// (pipelined WebSocket publishers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publish_via: Option<&'static str>,
    /// Herald: the subscribers' wire when not `/ws` (`centrifugo-protobuf`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wire: Option<&'static str>,
    /// `ws` publishing: most unanswered publishes per connection, and the
    /// number of publishing connections.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ws_publishers: Option<u64>,
    /// `publish --batch`: messages per request (absent: one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<u64>,
    /// Publishes entered on another node than the subscribers'
    /// (`--publish-target`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cross_node: bool,
    // verification
    pub expected: u64,
    pub delivered: u64,
    pub lost: u64,
    pub duplicates: u64,
    pub reordered: u64,
    /// Herald acked channels: messages sent again because an ack was late
    /// (expected behaviour, not an error).
    pub redeliveries: u64,
    pub disconnects: u64,
    pub resumes: u64,
    // figures
    pub duration_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deliveries_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publishes_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p50_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p999_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_ms: Option<f64>,
    /// `ws` publishing: publish → the server's answer, over every publish
    /// of the phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publish_p50_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publish_p99_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_rss_before_kb: Option<u64>,
    /// idle: a few seconds after the last connection opened.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_rss_settled_kb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_rss_kb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_per_conn_kb: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_cpu_pct: Option<f64>,
    /// The kernel's part of `server_cpu_pct` (its `stime`): system calls
    /// and, on loopback, the network stack of both ends of a send.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_sys_cpu_pct: Option<f64>,
    /// The bench's own CPU (publishers and workers) over the same window:
    /// it shares the machine with the server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_cpu_pct: Option<f64>,
    /// Every other process on the machine over the same window: a large
    /// value means the run competed with outside work.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub other_cpu_pct: Option<f64>,
    /// reconnect: from the drop command until the last client resumed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub all_resumed_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume_p50_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume_p99_ms: Option<f64>,
    /// acked, drain: from the first subscribe until the ack that covered
    /// the last inbox.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain_s: Option<f64>,
    /// acked, drain: one user's subscribe → the ack covering its inbox.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain_p50_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain_p99_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain_max_ms: Option<f64>,
    /// acked, drain: sum of `unread` in the subscribe replies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unread_at_subscribe: Option<u64>,
    /// acked: ack frames the clients sent (cumulative acks, batched), and
    /// per second over the phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acks_sent: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acks_per_s: Option<f64>,
    /// acked: `herald_acks_total` over the phase (acks that advanced a
    /// cursor), and per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_acks: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_acks_per_s: Option<f64>,
    /// acked: `herald_redeliveries_total` over the phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_redeliveries: Option<u64>,
    /// cluster: the nodes' and Redis's figures of the phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterFigures>,
    pub versions: Versions,
    pub machine: Machine,
    /// What "verified" means for this scenario (summary only).
    #[serde(skip)]
    pub checks: &'static str,
}

impl Report {
    pub fn new(args: &BenchArgs, run_id: &str) -> Report {
        Report {
            scenario: args.scenario.name(),
            phase: None,
            peer: args.peer.name(),
            label: args.label.clone(),
            run_id: run_id.to_owned(),
            started_at: crate::payload::now_micros() / 1_000_000,
            ok: true,
            problems: Vec::new(),
            connections: 0,
            publishers: None,
            messages: None,
            rate: None,
            size: None,
            namespace: None,
            workers: 0,
            publish_via: None,
            wire: (args.wire != crate::args::SubWire::Herald).then(|| args.wire.name()),
            window: None,
            ws_publishers: None,
            batch: (args.batch > 1).then_some(args.batch as u64),
            cross_node: args.publish_target.is_some(),
            expected: 0,
            delivered: 0,
            lost: 0,
            duplicates: 0,
            reordered: 0,
            redeliveries: 0,
            disconnects: 0,
            resumes: 0,
            duration_s: 0.0,
            deliveries_per_s: None,
            publishes_per_s: None,
            p50_ms: None,
            p99_ms: None,
            p999_ms: None,
            max_ms: None,
            mean_ms: None,
            publish_p50_ms: None,
            publish_p99_ms: None,
            server_rss_before_kb: None,
            server_rss_settled_kb: None,
            server_rss_kb: None,
            rss_per_conn_kb: None,
            server_cpu_pct: None,
            server_sys_cpu_pct: None,
            client_cpu_pct: None,
            other_cpu_pct: None,
            all_resumed_s: None,
            resume_p50_ms: None,
            resume_p99_ms: None,
            drain_s: None,
            drain_p50_ms: None,
            drain_p99_ms: None,
            drain_max_ms: None,
            unread_at_subscribe: None,
            acks_sent: None,
            acks_per_s: None,
            server_acks: None,
            server_acks_per_s: None,
            server_redeliveries: None,
            cluster: None,
            versions: Versions { bench: env!("CARGO_PKG_VERSION"), server: None },
            machine: Machine::describe(),
            checks: "every expected delivery arrived once, in order",
        }
    }

    /// Take the verification counts and latency of a delivery period.
    pub fn apply_tally(&mut self, t: &Tally) {
        self.delivered = t.delivered;
        self.lost = t.lost;
        self.duplicates = t.duplicates;
        self.reordered = t.reordered;
        self.redeliveries = t.redeliveries;
        self.disconnects = t.disconnects;
        self.resumes = t.resumes;
        self.apply_latency(&Histogram::from_wire(&t.latency));
        for p in t.problems() {
            self.fail(p);
        }
        if !t.errors.is_empty() && !self.ok {
            self.problems.push(format!("first errors: {}", t.errors.join(" | ")));
        }
    }

    pub fn apply_latency(&mut self, h: &Histogram) {
        self.p50_ms = h.quantile_ms(0.5);
        self.p99_ms = h.quantile_ms(0.99);
        self.p999_ms = h.quantile_ms(0.999);
        self.max_ms = h.max_ms();
        self.mean_ms = h.mean_ms();
    }

    /// CPU over the measurement window, and the server's RSS at its end.
    pub fn apply_window(&mut self, a: &CpuSnapshot, b: &CpuSnapshot) {
        let w = a.window(b);
        self.server_cpu_pct = w.server_pct.map(round2);
        self.server_sys_cpu_pct = w.server_sys_pct.map(round2);
        self.client_cpu_pct = w.client_pct.map(round2);
        self.other_cpu_pct = Some(round2(w.other_pct));
        if let Some(s) = b.server {
            self.server_rss_kb = Some(s.rss_kb);
        }
    }

    /// The publishing side of a phase: how, and (pipelined) what the
    /// publishers' answers took.
    pub fn apply_publishing(&mut self, args: &BenchArgs, answers: Option<&Histogram>) {
        self.publish_via = Some(args.publish_via.name());
        if args.publish_via == crate::args::PublishVia::Ws {
            self.window = Some(args.window as u64);
            self.ws_publishers = Some(args.ws_publishers as u64);
        }
        if let Some(h) = answers {
            self.publish_p50_ms = h.quantile_ms(0.5);
            self.publish_p99_ms = h.quantile_ms(0.99);
        }
    }

    pub fn fail(&mut self, problem: impl Into<String>) {
        self.ok = false;
        self.problems.push(problem.into());
    }

    /// Print the summary and append the JSON line.
    pub fn emit(&self, json: Option<&Path>) -> anyhow::Result<()> {
        println!("{}", self.summary());
        if let Some(path) = json {
            let mut line = serde_json::to_vec(self)?;
            line.push(b'\n');
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("cannot open {}", path.display()))?;
            f.write_all(&line).with_context(|| format!("cannot write {}", path.display()))?;
        }
        Ok(())
    }

    fn summary(&self) -> String {
        let mut s = format!("== {} against {}", self.scenario, self.peer);
        if let Some(wire) = self.wire {
            s.push_str(&format!(" ({wire} subscribers)"));
        }
        if let Some(phase) = self.phase {
            s.push_str(&format!(", {phase}"));
        }
        if let Some(rate) = &self.rate {
            s.push_str(&format!(" (rate {rate})"));
        }
        s.push_str(&format!("\n   connections {}   workers {}", self.connections, self.workers));
        if let Some(p) = self.publishers {
            s.push_str(&format!("   publishers {p}"));
        }
        if let Some(b) = self.batch {
            s.push_str(&format!("   {b} messages a request"));
        }
        if let (Some(via), Some(w)) = (self.publish_via, self.window) {
            s.push_str(&format!("   publish via {via} (window {w})"));
            if self.cross_node {
                s.push_str(" on another node");
            }
        }
        s.push_str(&format!("   duration {:.1} s\n", self.duration_s));
        if self.expected > 0 {
            s.push_str(&format!(
                "   expected {}   delivered {}   lost {}   duplicates {}   reordered {}   disconnects {}   resumes {}\n",
                self.expected, self.delivered, self.lost, self.duplicates, self.reordered, self.disconnects, self.resumes
            ));
            if self.redeliveries > 0 {
                s.push_str(&format!("   redeliveries (late acks) {}\n", self.redeliveries));
            }
        }
        let mut acks = Vec::new();
        let mut count = |name: &str, v: Option<u64>| {
            if let Some(v) = v {
                acks.push(format!("{name} {v}"));
            }
        };
        count("unread at subscribe", self.unread_at_subscribe);
        count("ack frames sent", self.acks_sent);
        count("server acks", self.server_acks);
        count("server redeliveries", self.server_redeliveries);
        if !acks.is_empty() {
            s.push_str(&format!("   {}\n", acks.join("   ")));
        }
        let mut figures = Vec::new();
        let mut add = |name: &str, v: Option<f64>, unit: &str| {
            if let Some(v) = v {
                figures.push(format!("{name} {}{unit}", fmt_num(v)));
            }
        };
        add("deliveries/s", self.deliveries_per_s, "");
        add("publishes/s", self.publishes_per_s, "");
        add("p50", self.p50_ms, " ms");
        add("p99", self.p99_ms, " ms");
        add("p99.9", self.p999_ms, " ms");
        add("publish→answer p50", self.publish_p50_ms, " ms");
        add("publish→answer p99", self.publish_p99_ms, " ms");
        add("max", self.max_ms, " ms");
        add("all resumed in", self.all_resumed_s, " s");
        add("resume p50", self.resume_p50_ms, " ms");
        add("resume p99", self.resume_p99_ms, " ms");
        add("drained in", self.drain_s, " s");
        add("drain p50", self.drain_p50_ms, " ms");
        add("drain p99", self.drain_p99_ms, " ms");
        add("drain max", self.drain_max_ms, " ms");
        add("acks/s", self.acks_per_s, "");
        add("server acks/s", self.server_acks_per_s, "");
        add("server RSS before", self.server_rss_before_kb.map(|v| v as f64), " KB");
        add("server RSS settled", self.server_rss_settled_kb.map(|v| v as f64), " KB");
        add("server RSS", self.server_rss_kb.map(|v| v as f64), " KB");
        add("RSS/conn", self.rss_per_conn_kb, " KB");
        add("server CPU", self.server_cpu_pct, " %");
        add("of it kernel", self.server_sys_cpu_pct, " %");
        add("client CPU", self.client_cpu_pct, " %");
        add("other CPU", self.other_cpu_pct, " %");
        if !figures.is_empty() {
            s.push_str(&format!("   {}\n", figures.join("   ")));
        }
        if self.ok {
            s.push_str(&format!("   verified: {}", self.checks));
        } else {
            s.push_str("   FAILED:");
            for p in &self.problems {
                s.push_str(&format!("\n   !! {p}"));
            }
        }
        s
    }
}

pub fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

fn fmt_num(v: f64) -> String {
    if v >= 1000.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}
