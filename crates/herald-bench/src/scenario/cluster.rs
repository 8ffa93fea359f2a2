//! `cluster`: N connections spread round-robin over the nodes of a Herald
//! cluster on one Redis (`--targets`), in four phases:
//!
//! 1. **connect**: every connection opens on node `i % nodes` and
//!    subscribes to one durable channel (`chat:{run}-all`); each node's RSS
//!    before and after gives its memory per connection.
//! 2. **broadcast**: `--broadcast-messages` to that channel at
//!    `--broadcast-rate`, one pipelined publisher on node 0: every message
//!    goes to every connection.
//! 3. **idle**, then **p2p**: the connections reopen, each on its own
//!    durable channel (`chat:{run}-{i}`), and are held for `--hold` with no
//!    traffic (the background cost: heartbeats, head checks); then
//!    `--messages` rounds to every channel at `--rate`,
//!    one pipelined publisher on each node but the one `--kill-node` names.
//!    Halfway through, that node gets SIGKILL: its clients reconnect
//!    (each after a random wait below `--jitter`, as SDKs back off) to
//!    the others ([`crate::worker::wire::node_for`]) and resume with
//!    `since`.
//! 4. **presence**: `--churn-clients` join and leave a presence channel on
//!    the surviving nodes, `--churn-rounds` times; after each join the
//!    listing (read from another node) must count every client, after each
//!    leave none.
//!
//! Each phase reports node CPU seconds, Redis CPU seconds and Redis
//! commands (`INFO`) over it, per message; every delivery is checked
//! (lost = duplicated = reordered = 0, or the run fails).

use std::time::Duration;

use anyhow::{bail, Context};
use futures_util::StreamExt;
use tokio::time::Instant;

use crate::args::Rate;
use crate::fleet::{Fleet, FleetPlan};
use crate::proc_stats::{self, CpuSnapshot, ProcSample};
use crate::protocol::{Endpoint, ResumePoint, SubConn};
use crate::redis_info::{RedisDelta, RedisSample};
use crate::report::{round2, ClusterFigures, Report};
use crate::worker::wire::{Layout, WorkerSpec};

use super::{endpoint, publish_pipelined_on, Ctx, Measured};

/// Time for the nodes' allocators and the last handshakes to settle
/// before the "after" memory reading.
const SETTLE: Duration = Duration::from_secs(3);
/// Concurrent opens of the presence churn clients.
const CHURN_CONCURRENCY: usize = 256;
/// How long a presence listing may take to show a round's joins or leaves.
const PRESENCE_WAIT: Duration = Duration::from_secs(15);

/// The nodes' processes.
struct Nodes {
    pids: Vec<u32>,
}

impl Nodes {
    /// One reading per node; `None` for a node that is gone.
    fn sample(&self) -> Vec<Option<ProcSample>> {
        self.pids.iter().map(|&p| proc_stats::sample(p).ok()).collect()
    }
}

/// CPU seconds the nodes alive at both readings spent between them.
fn cpu_seconds(a: &[Option<ProcSample>], b: &[Option<ProcSample>]) -> Option<f64> {
    let ticks: u64 = a
        .iter()
        .zip(b)
        .filter_map(|(a, b)| Some(b.as_ref()?.cpu_ticks.saturating_sub(a.as_ref()?.cpu_ticks)))
        .sum();
    (!a.is_empty()).then(|| ticks as f64 / proc_stats::clock_ticks_per_sec())
}

/// RSS growth per connection of each node, KB: node `k` holds the
/// connections `i` with `i % nodes == k`.
fn rss_per_conn(before: &[Option<ProcSample>], after: &[Option<ProcSample>], connections: usize) -> Vec<f64> {
    let nodes = before.len();
    before
        .iter()
        .zip(after)
        .enumerate()
        .map(|(k, (b, a))| {
            let held = connections / nodes + usize::from(k < connections % nodes);
            match (b, a) {
                (Some(b), Some(a)) if held > 0 => round2((a.rss_kb as f64 - b.rss_kb as f64) / held as f64),
                _ => 0.0,
            }
        })
        .collect()
}

/// Start and end of one phase's resource readings.
struct Window {
    nodes: Vec<Option<ProcSample>>,
    redis: Option<RedisSample>,
    at: Instant,
}

impl Window {
    async fn take(args: &crate::args::BenchArgs, nodes: &Nodes) -> anyhow::Result<Window> {
        let redis = match &args.redis_addr {
            Some(addr) => Some(RedisSample::take(addr, args.redis_pid).await?),
            None => None,
        };
        Ok(Window { nodes: nodes.sample(), redis, at: Instant::now() })
    }

    /// The figures between `self` and `end`, over `messages` messages that
    /// made `deliveries` deliveries.
    fn figures(&self, end: &Window, n_nodes: usize, messages: u64, deliveries: u64) -> ClusterFigures {
        let node_cpu_s = cpu_seconds(&self.nodes, &end.nodes);
        let redis = match (&self.redis, &end.redis) {
            (Some(a), Some(b)) => a.delta(b),
            _ => RedisDelta::default(),
        };
        let per = |v: f64, n: u64| (n > 0).then(|| round2(v / n as f64));
        let secs = end.at.duration_since(self.at).as_secs_f64();
        ClusterFigures {
            redis_commands_per_s: (self.redis.is_some() && secs > 0.0)
                .then(|| round2(redis.commands as f64 / secs)),
            nodes: n_nodes as u64,
            messages,
            node_cpu_s: node_cpu_s.map(round2),
            node_cpu_us_per_delivery: node_cpu_s.and_then(|s| per(s * 1e6, deliveries)),
            redis_ops_per_message: self.redis.as_ref().and_then(|_| per(redis.commands as f64, messages)),
            redis: RedisDelta { cpu_s: redis.cpu_s.map(round2), ..redis },
            ..ClusterFigures::default()
        }
    }
}

/// One line of a phase's cluster figures; `per` names what node CPU and
/// Redis commands are counted per (`["delivery", "message"]`).
fn print_figures(phase: &str, per: [&str; 2], f: &ClusterFigures) {
    let opt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v}"));
    let mut line = format!("   [{phase}] node CPU {} s", opt(f.node_cpu_s));
    if let Some(us) = f.node_cpu_us_per_delivery {
        line.push_str(&format!(" ({us} µs per {})", per[0]));
    }
    line.push_str(&format!("   Redis CPU {} s   Redis commands {}", opt(f.redis.cpu_s), f.redis.commands));
    if let Some(n) = f.redis_ops_per_message {
        line.push_str(&format!(" ({n} per {})", per[1]));
    }
    if let Some(rate) = f.redis_commands_per_s {
        line.push_str(&format!(", {rate}/s"));
    }
    println!("{line}: {}", f.redis.top(6));
}

pub async fn run(ctx: &Ctx<'_>) -> anyhow::Result<Vec<Report>> {
    let args = ctx.args;
    let n = args.connections();
    let mut endpoints = Vec::with_capacity(args.targets.len());
    for t in &args.targets {
        endpoints.push(endpoint(args, t).await?);
    }
    let n_nodes = endpoints.len();
    let nodes = Nodes { pids: args.server_pids.clone() };
    let mut reports = Vec::new();

    // 1. connect, on the broadcast channel.
    let all = format!("chat:{}-all", ctx.run_id);
    let before = nodes.sample();
    let started = Instant::now();
    let bplanned = Duration::from_secs_f64(args.broadcast_messages as f64 / args.broadcast_rate);
    let plan = FleetPlan {
        endpoints: endpoints.clone(),
        run_id: ctx.run_id.clone(),
        connections: n,
        layout: Layout::Shared { channel: all.clone() },
        resume: true,
        resume_jitter: args.jitter,
        lifetime: ctx.lifetime(2, bplanned),
    };
    let mut fleet = Fleet::start(args, plan).await?;
    let connect_s = started.elapsed().as_secs_f64();
    println!(
        "   [connect] {} connections over {n_nodes} nodes in {connect_s:.1} s ({} worker processes)",
        fleet.connected,
        fleet.len()
    );
    tokio::time::sleep(SETTLE).await;
    let after = nodes.sample();
    let mut connect = ClusterFigures {
        nodes: n_nodes as u64,
        rss_per_conn_kb: rss_per_conn(&before, &after, n),
        rss_kb: after.iter().map(|s| s.map_or(0, |s| s.rss_kb)).collect(),
        ..ClusterFigures::default()
    };
    connect.node_cpu_s = cpu_seconds(&before, &after).map(round2);
    println!(
        "   [connect] RSS per connection per node (KB): {:?}   node RSS (MB): {:?}",
        connect.rss_per_conn_kb,
        connect.rss_kb.iter().map(|kb| kb / 1024).collect::<Vec<_>>()
    );
    let mut report = ctx.report();
    report.phase = Some("connect");
    report.connections = n as u64;
    report.workers = fleet.len() as u64;
    report.duration_s = round2(connect_s);
    report.checks = "every connection opened and subscribed";
    let per_node = &connect.rss_per_conn_kb;
    report.rss_per_conn_kb =
        (!per_node.is_empty()).then(|| round2(per_node.iter().sum::<f64>() / per_node.len() as f64));
    report.cluster = Some(connect);
    reports.push(report);

    // 2. broadcast.
    let rate = Rate::PerSec(args.broadcast_rate);
    let mut report = ctx.fleet_report(&fleet, args.broadcast_messages, rate);
    report.phase = Some("broadcast");
    report.expected = args.broadcast_messages * n as u64;
    let w0 = Window::take(args, &nodes).await?;
    let measured = Measured::start(args, &fleet)?;
    let deadline = measured.started + bplanned + args.timeout;
    let stats = publish_pipelined_on(
        ctx,
        &endpoints[..1],
        std::slice::from_ref(&all),
        (0, args.broadcast_messages),
        rate,
        deadline,
    )
    .await;
    let wait = if stats.errors.is_empty() { args.timeout } else { Duration::from_secs(5) };
    let tally = fleet.collect(args.broadcast_messages, wait).await?;
    let w1 = CpuSnapshot::take(None, fleet.client_sample())?;
    let end = Window::take(args, &nodes).await?;
    measured.finish(&mut report, &w1, &tally);
    report.apply_publishing(args, Some(&stats.latency));
    if !stats.errors.is_empty() {
        report.fail(format!("broadcast publishing failed: {}", stats.errors.join(" | ")));
    }
    let figures = w0.figures(&end, n_nodes, stats.acked, tally.delivered);
    print_figures("broadcast", ["delivery", "message"], &figures);
    report.cluster = Some(figures);
    reports.push(report);
    fleet.stop().await;

    // 3. p2p, one node killed midway.
    let Rate::PerSec(p2p_rate) = *args.rates()?.first().expect("rates() is never empty") else {
        bail!("`cluster` needs a paced --rate");
    };
    let rounds = args.messages.unwrap_or(4);
    let total = rounds * n as u64;
    let planned = Duration::from_secs_f64(total as f64 / p2p_rate);
    let layout = Layout::PerUser { prefix: "chat:".into() };
    let plan = FleetPlan {
        endpoints: endpoints.clone(),
        run_id: ctx.run_id.clone(),
        connections: n,
        layout: layout.clone(),
        resume: true,
        resume_jitter: args.jitter,
        lifetime: ctx.lifetime(3, planned),
    };
    let started = Instant::now();
    let mut fleet = Fleet::start(args, plan).await?;
    println!(
        "   [p2p] {} users subscribed again, each on its own channel, in {:.1} s; {rounds} messages each at {p2p_rate}/s in all",
        fleet.connected,
        started.elapsed().as_secs_f64()
    );
    // Held idle first: what N subscribed connections cost with no traffic.
    let w0 = Window::take(args, &nodes).await?;
    tokio::time::sleep(args.hold).await;
    let end = Window::take(args, &nodes).await?;
    let figures = w0.figures(&end, n_nodes, 0, 0);
    let mut report = ctx.report();
    report.phase = Some("idle");
    report.connections = n as u64;
    report.workers = fleet.len() as u64;
    report.duration_s = round2(args.hold.as_secs_f64());
    report.checks = "nothing published: the cost of holding the subscribed connections";
    print_figures("idle", ["delivery", "message"], &figures);
    report.cluster = Some(figures);
    reports.push(report);

    let channels: Vec<String> = (0..n).map(|i| WorkerSpec::channel(&layout, &ctx.run_id, i)).collect();
    let publishers_on: Vec<Endpoint> = endpoints
        .iter()
        .enumerate()
        .filter(|&(k, _)| Some(k) != args.kill_node)
        .map(|(_, e)| e.clone())
        .collect();
    let mut report = ctx.fleet_report(&fleet, total, Rate::PerSec(p2p_rate));
    report.phase = Some("p2p");
    report.namespace = Some("chat".into());
    report.publishers = Some(publishers_on.len() as u64);
    report.expected = total;
    let w0 = Window::take(args, &nodes).await?;
    let measured = Measured::start(args, &fleet)?;
    let deadline = measured.started + planned + args.timeout;
    let kill = async {
        let k = args.kill_node?;
        tokio::time::sleep(planned / 2).await;
        let pid = args.server_pids[k];
        // SAFETY: kill(2) with a pid the operator named; no memory involved.
        let rc = unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        let at = crate::payload::now_micros();
        println!(
            "   [p2p] node {k} (pid {pid}) killed with SIGKILL {:.1} s into the phase",
            planned.as_secs_f64() / 2.0
        );
        (rc == 0).then_some((k, at))
    };
    let (stats, killed) = tokio::join!(
        publish_pipelined_on(ctx, &publishers_on, &channels, (0, rounds), Rate::PerSec(p2p_rate), deadline),
        kill
    );
    let publish_secs = measured.started.elapsed().as_secs_f64();
    let wait = if stats.errors.is_empty() { args.timeout } else { Duration::from_secs(5) };
    let tally = fleet.collect(rounds, wait).await?;
    let w1 = CpuSnapshot::take(None, fleet.client_sample())?;
    let end = Window::take(args, &nodes).await?;
    measured.finish(&mut report, &w1, &tally);
    report.publishes_per_s = Some(round2(stats.acked as f64 / publish_secs.max(1e-9)));
    report.apply_publishing(args, Some(&stats.latency));
    if !stats.errors.is_empty() {
        report.fail(format!("p2p publishing failed: {}", stats.errors.join(" | ")));
    }
    let mut figures = w0.figures(&end, n_nodes, stats.acked, tally.delivered);
    if let Some(k) = args.kill_node {
        let held = n / n_nodes + usize::from(k < n % n_nodes);
        match killed {
            Some((k, at)) => {
                figures.killed_node = Some(k as u64);
                figures.reconnect_s = tally.last_resume_us.map(|t| round2(t.saturating_sub(at) as f64 / 1e6));
                println!(
                    "   [p2p] {} connections lost, {} resumed on the other nodes; the last {} s after the kill \
                     (node {k} held {held})",
                    tally.disconnects,
                    tally.resumes,
                    figures.reconnect_s.map_or("-".into(), |s| s.to_string())
                );
                if (tally.resumes as usize) < held {
                    report
                        .fail(format!("only {} of the killed node's {held} clients resumed", tally.resumes));
                }
            }
            None => report.fail(format!("node {k} could not be killed")),
        }
    }
    print_figures("p2p", ["delivery", "message"], &figures);
    report.cluster = Some(figures);
    reports.push(report);

    // 4. presence churn, on the surviving nodes, the p2p fleet still open.
    reports.push(churn(ctx, &publishers_on, &nodes).await?);
    fleet.stop().await;
    Ok(reports)
}

/// Presence churn: every round, `--churn-clients` open and subscribe to
/// one presence channel (client `c` on `on[c % len]`), the listing must
/// count all of them, they close, and it must count none.
async fn churn(ctx: &Ctx<'_>, on: &[Endpoint], nodes: &Nodes) -> anyhow::Result<Report> {
    let args = ctx.args;
    let clients = args.churn_clients;
    let channel = format!("{}:{}-churn", args.presence_namespace, ctx.run_id);
    let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(5)).build()?;
    // Read the listing from the last surviving node, opened on all of them.
    let list_on = on.last().context("no node to churn on")?;
    let url = format!("http://{}/api/v1/channels/{channel}/presence?count=1", list_on.authority);
    let mut report = ctx.report();
    report.phase = Some("presence");
    report.connections = clients as u64;
    report.checks = "the listing counted every member after each join round and none after each leave round";
    let w0 = Window::take(args, &nodes_alive(nodes)).await?;
    let started = Instant::now();
    let mut busy = Duration::ZERO;
    for round in 0..args.churn_rounds {
        let t = Instant::now();
        let opened: Vec<anyhow::Result<SubConn>> = futures_util::stream::iter(0..clients)
            .map(|c| {
                let ep = &on[c % on.len()];
                let user = format!("{}-churn{c}", ctx.run_id);
                let channel = &channel;
                async move {
                    let (conn, _) = SubConn::open(ep, None, &user, channel, &ResumePoint::default()).await?;
                    anyhow::Ok(conn)
                }
            })
            .buffer_unordered(CHURN_CONCURRENCY)
            .collect()
            .await;
        let joined_in = t.elapsed();
        let (conns, errors): (Vec<_>, Vec<_>) = opened.into_iter().partition(Result::is_ok);
        let conns: Vec<SubConn> = conns.into_iter().map(Result::unwrap).collect();
        if let Some(Err(e)) = errors.into_iter().next() {
            report.fail(format!("round {round}: a churn client could not join: {e:#}"));
        }
        let joined = conns.len() as u64;
        if let Err(e) = await_count(&http, &url, joined).await {
            report.fail(format!("round {round}, after the joins: {e:#}"));
        }
        let t = Instant::now();
        futures_util::stream::iter(conns).for_each_concurrent(CHURN_CONCURRENCY, SubConn::close).await;
        busy += joined_in + t.elapsed();
        if let Err(e) = await_count(&http, &url, 0).await {
            report.fail(format!("round {round}, after the leaves: {e:#}"));
        }
    }
    let end = Window::take(args, &nodes_alive(nodes)).await?;
    let events = 2 * clients as u64 * args.churn_rounds;
    let mut figures = w0.figures(&end, on.len(), events, events);
    figures.churn_per_s = Some(round2(events as f64 / busy.as_secs_f64().max(1e-9)));
    report.duration_s = round2(started.elapsed().as_secs_f64());
    println!(
        "   [presence] {clients} clients × {} rounds on {} nodes: {events} joins + leaves, {} per second",
        args.churn_rounds,
        on.len(),
        figures.churn_per_s.unwrap_or(0.0)
    );
    print_figures("presence", ["join or leave"; 2], &figures);
    report.cluster = Some(figures);
    Ok(report)
}

/// The nodes still running (the killed one is left out of the readings).
fn nodes_alive(nodes: &Nodes) -> Nodes {
    Nodes { pids: nodes.pids.iter().copied().filter(|&p| proc_stats::sample(p).is_ok()).collect() }
}

/// Poll the presence listing until it counts `want` members, within
/// [`PRESENCE_WAIT`].
async fn await_count(http: &reqwest::Client, url: &str, want: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + PRESENCE_WAIT;
    loop {
        let got = presence_count(http, url).await;
        match &got {
            Ok(c) if *c == want => return Ok(()),
            _ if Instant::now() >= deadline => {
                bail!("presence listing {url}: want {want} members, last read {got:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn presence_count(http: &reqwest::Client, url: &str) -> anyhow::Result<u64> {
    let resp = http.get(url).send().await?;
    let status = resp.status();
    let body: serde_json::Value = resp.json().await?;
    if !status.is_success() {
        bail!("{status}: {body}");
    }
    body.get("count").and_then(serde_json::Value::as_u64).context("no `count` in the presence listing")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rss_kb: u64, cpu_ticks: u64) -> Option<ProcSample> {
        Some(ProcSample { rss_kb, cpu_ticks, sys_ticks: 0, at: std::time::Instant::now() })
    }

    #[test]
    fn rss_per_connection_divides_by_what_each_node_holds() {
        // 10 connections over 3 nodes: 4, 3, 3.
        let before = [at(1000, 0), at(1000, 0), at(1000, 0)];
        let after = [at(1400, 0), at(1300, 0), None];
        assert_eq!(rss_per_conn(&before, &after, 10), vec![100.0, 100.0, 0.0]);
    }

    #[test]
    fn cpu_seconds_count_only_nodes_alive_at_both_ends() {
        let hz = proc_stats::clock_ticks_per_sec();
        let a = [at(0, 100), at(0, 100)];
        let b = [at(0, 100 + hz as u64), None];
        assert_eq!(cpu_seconds(&a, &b), Some(1.0));
        assert_eq!(cpu_seconds(&[], &[]), None);
    }
}
