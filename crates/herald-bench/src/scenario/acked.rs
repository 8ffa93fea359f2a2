//! `acked` (Herald only): N users, each with its own acked channel
//! (`user:<name>`; `--namespace` must name an acked namespace), every
//! client acking as a real one would (cumulative acks, batched). Two
//! reports:
//!
//! 1. **drain**: M messages per user are published over HTTP, each with an
//!    `Idempotency-Key`, while nobody is subscribed (the offline inbox).
//!    Then the N clients connect and subscribe without `since`; each gets
//!    its inbox (the subscribe reply must announce `unread` = M) and acks
//!    it. Drain time runs from the first subscribe to the ack covering the
//!    last inbox; per user from its subscribe to its covering ack.
//! 2. **live**: with every client connected, M more messages per user at
//!    `--rate`: deliveries/s and publish → deliver latency, all acked.
//!
//! Both phases verify that every message arrived once and in order
//! (redeliveries after a late ack are counted, not treated as duplicates),
//! that every client acked all it got, and, outside the timed part, that
//! the server stored it: every user's cursor equals the channel head
//! (`GET /api/v1/channels/{channel}/cursors`). Acks per second are given
//! from the clients' count of ack frames and from the server's
//! `herald_acks_total`.

use std::time::Duration;

use anyhow::bail;
use herald_client::HttpApi;
use tokio::time::Instant;

use crate::args::{Peer, Rate};
use crate::fleet::{Fleet, FleetPlan};
use crate::herald_api::{ensure_acked, verify_cursors, AckCounters};
use crate::hist::Histogram;
use crate::payload::now_micros;
use crate::proc_stats::{maybe_sample, sample, CpuSnapshot};
use crate::report::{round2, Report};
use crate::tally::Tally;
use crate::worker::wire::{Layout, WorkerSpec};

use super::{per_second, publish_per_user, Ctx, Publishing};

/// Messages per user in each phase unless `--messages` says otherwise.
const DEFAULT_PER_USER: u64 = 50;
/// Cursor problems quoted in a report.
const EXAMPLES: usize = 3;

const CHECKS: &str = "every message arrived once, in order, and was acked; the server's cursor of every \
                      user reached the channel head";

/// What both phases share.
struct Setup<'a> {
    ctx: &'a Ctx<'a>,
    api: &'a HttpApi,
    /// Users (= connections) and messages per user and phase.
    n: usize,
    m: u64,
    rate: Rate,
    publishers: usize,
    channels: Vec<String>,
}

impl Setup<'_> {
    fn report(&self, phase: &'static str) -> Report {
        let mut r = self.ctx.report();
        r.phase = Some(phase);
        r.connections = self.n as u64;
        r.namespace = Some(self.ctx.args.namespace().to_owned());
        r.publishers = Some(self.publishers as u64);
        r.messages = Some(self.m * self.n as u64);
        r.size = Some(self.ctx.args.size as u64);
        r.expected = self.m * self.n as u64;
        r.checks = CHECKS;
        r
    }

    /// Round `n0..n0 + m` to every user, with Idempotency-Keys.
    async fn publish(&self, n0: u64, rate: Rate, deadline: Instant) -> anyhow::Result<Publishing> {
        publish_per_user(self.ctx, &self.channels, (n0, self.m), rate, self.publishers, true, deadline).await
    }
}

pub async fn run(ctx: &Ctx<'_>) -> anyhow::Result<Vec<Report>> {
    let args = ctx.args;
    let (Some(api), Peer::Herald) = (ctx.publishers.herald_api(), args.peer) else {
        bail!("`acked` runs against Herald only: the peers have no acked delivery");
    };
    let n = args.connections();
    let m = args.messages.unwrap_or(DEFAULT_PER_USER);
    if m == 0 {
        bail!("--messages (per user) must be positive for `acked`");
    }
    let layout = Layout::PerUser { prefix: format!("{}:", args.namespace()) };
    let setup = Setup {
        ctx,
        api,
        n,
        m,
        rate: *args.rates()?.first().expect("rates() is never empty"),
        publishers: args.publishers().min(n),
        channels: (0..n).map(|i| WorkerSpec::channel(&layout, &ctx.run_id, i)).collect(),
    };
    ensure_acked(api, &setup.channels[0]).await.map_err(|e| {
        e.context(format!("`acked` needs an acked namespace (--namespace {} is not)", args.namespace()))
    })?;

    // Fill the offline inboxes (not timed as delivery).
    println!("   filling {n} offline inboxes with {m} messages each ({} publishers)", setup.publishers);
    let mut drain = setup.report("drain");
    let fill = setup.publish(0, Rate::Max, Instant::now() + args.timeout).await?;
    drain.publishes_per_s = Some(round2(fill.published as f64 / fill.elapsed.as_secs_f64().max(1e-9)));
    if !fill.errors.is_empty() {
        // Nobody was connected: what was not published is what would be lost.
        drain.lost = drain.expected - fill.published;
        fail_publishing(&mut drain, &fill);
        return Ok(vec![drain]);
    }

    let planned = setup.rate.interval(1).map_or(Duration::ZERO, |iv| iv.mul_f64((m * n as u64) as f64));
    let plan = ctx.fleet_plan(layout, true, ctx.lifetime(3, planned));
    let (mut fleet, rss_before) = drain_inboxes(&setup, plan, &mut drain).await?;
    let live = publish_live(&setup, &mut fleet, planned).await;
    fleet.stop().await;
    let mut live = live?;
    live.server_rss_before_kb = rss_before;
    Ok(vec![drain, live])
}

/// Connect everyone and let the inboxes drain; the fleet stays connected
/// for the live phase. Also returns the server RSS before connecting.
async fn drain_inboxes(
    setup: &Setup<'_>,
    plan: FleetPlan,
    drain: &mut Report,
) -> anyhow::Result<(Fleet, Option<u64>)> {
    let (args, api, n, m) = (setup.ctx.args, setup.api, setup.n, setup.m);
    // Workers start after `w0`, so all their CPU falls inside the window.
    let counters0 = read_counters(api).await;
    let rss_before = maybe_sample(args.server_pid)?.map(|s| s.rss_kb);
    let w0 = CpuSnapshot::take(args.server_pid, sample(std::process::id()).ok())?;
    let started = Instant::now();
    let mut fleet = Fleet::start(args, plan).await?;
    println!("   {} users subscribed; draining", fleet.connected);
    let tally = fleet.collect_acked(m, args.timeout).await?;
    let w1 = CpuSnapshot::take(args.server_pid, fleet.client_sample())?;
    drain.workers = fleet.len() as u64;
    drain.duration_s = round2(started.elapsed().as_secs_f64());
    drain.apply_tally(&tally);
    drain.apply_window(&w0, &w1);
    // Publish → deliver time here is how long a message sat in the inbox,
    // which says more about the fill than about delivery: not reported.
    drain.apply_latency(&Histogram::default());
    drain.server_rss_before_kb = rss_before;
    drain.rss_per_conn_kb = rss_per_conn(rss_before, drain.server_rss_kb, n);
    let start_us = tally.first_subscribe_us;
    let drain_s = span_s(start_us, tally.last_ack_us);
    drain.drain_s = drain_s;
    let spans = Histogram::from_wire(&tally.drain);
    drain.drain_p50_ms = spans.quantile_ms(0.5);
    drain.drain_p99_ms = spans.quantile_ms(0.99);
    drain.drain_max_ms = spans.max_ms();
    drain.deliveries_per_s = start_us.and_then(|s| per_second(tally.delivered, s, tally.last_rx_us));
    drain.unread_at_subscribe = Some(tally.unread_at_subscribe);
    if tally.unread_at_subscribe != drain.expected {
        drain.fail(format!(
            "the subscribe replies announced {} unread messages, {} were published to the inboxes",
            tally.unread_at_subscribe, drain.expected
        ));
    }
    apply_acks(drain, &tally, drain_s);
    check_cursors(api, &setup.channels, m, drain).await;
    apply_server_acks(drain, counters0, read_counters(api).await, drain_s);
    Ok((fleet, rss_before))
}

/// With everyone connected, M more messages per user at `--rate`.
async fn publish_live(setup: &Setup<'_>, fleet: &mut Fleet, planned: Duration) -> anyhow::Result<Report> {
    let (args, api, m) = (setup.ctx.args, setup.api, setup.m);
    println!("   live: {m} more messages per user at {}/s", setup.rate.label());
    let mut live = setup.report("live");
    live.workers = fleet.len() as u64;
    live.rate = Some(setup.rate.label());
    let counters0 = read_counters(api).await;
    let w0 = CpuSnapshot::take(args.server_pid, fleet.client_sample())?;
    let start_us = now_micros();
    let started = Instant::now();
    let published = setup.publish(m, setup.rate, started + planned + args.timeout).await?;
    let tally = fleet.collect_acked(2 * m, args.timeout).await?;
    let w1 = CpuSnapshot::take(args.server_pid, fleet.client_sample())?;
    live.duration_s = round2(started.elapsed().as_secs_f64());
    live.apply_tally(&tally);
    live.apply_window(&w0, &w1);
    // No RSS per connection here: the growth over this phase is the log and
    // the idempotency receipts of the live publishes, not the connections.
    live.deliveries_per_s = per_second(tally.delivered, start_us, tally.last_rx_us);
    live.publishes_per_s =
        Some(round2(published.published as f64 / published.elapsed.as_secs_f64().max(1e-9)));
    if !published.errors.is_empty() {
        fail_publishing(&mut live, &published);
    }
    let live_s = span_s(Some(start_us), tally.last_ack_us.max(tally.last_rx_us));
    apply_acks(&mut live, &tally, live_s);
    check_cursors(api, &setup.channels, 2 * m, &mut live).await;
    apply_server_acks(&mut live, counters0, read_counters(api).await, live_s);
    Ok(live)
}

fn fail_publishing(report: &mut Report, p: &Publishing) {
    let mut errors = p.errors.clone();
    errors.truncate(3);
    report.fail(format!(
        "publishing stopped early ({} of {} sent; unsent ones count as lost): {}",
        p.published,
        report.expected,
        errors.join(" | ")
    ));
}

/// Seconds from `from_us` to `to_us`, when both are known and apart.
fn span_s(from_us: Option<u64>, to_us: Option<u64>) -> Option<f64> {
    let secs = to_us?.checked_sub(from_us?)? as f64 / 1e6;
    (secs > 0.0).then(|| round2(secs))
}

fn rate_per_s(count: u64, secs: Option<f64>) -> Option<f64> {
    secs.filter(|s| *s > 0.0).map(|s| (count as f64 / s).round())
}

/// Server RSS growth per connection since before the connections opened.
fn rss_per_conn(before_kb: Option<u64>, after_kb: Option<u64>, n: usize) -> Option<f64> {
    Some(round2((after_kb? as f64 - before_kb? as f64) / n.max(1) as f64))
}

fn apply_acks(report: &mut Report, tally: &Tally, secs: Option<f64>) {
    report.acks_sent = Some(tally.acks_sent);
    report.acks_per_s = rate_per_s(tally.acks_sent, secs);
}

/// `/metrics` is read best-effort: without it the server-side ack figures
/// are left out, and the run says why.
async fn read_counters(api: &HttpApi) -> Option<AckCounters> {
    match AckCounters::read(api).await {
        Ok(c) => Some(c),
        Err(e) => {
            println!("   note: no server ack counters: {e:#}");
            None
        }
    }
}

fn apply_server_acks(
    report: &mut Report,
    before: Option<AckCounters>,
    after: Option<AckCounters>,
    secs: Option<f64>,
) {
    let (Some(before), Some(after)) = (before, after) else { return };
    let d = after.since(&before);
    report.server_acks = Some(d.acks);
    report.server_acks_per_s = rate_per_s(d.acks, secs);
    report.server_redeliveries = Some(d.redeliveries);
}

/// Outside the timed part: every user's cursor must have reached `want`.
async fn check_cursors(api: &HttpApi, channels: &[String], want: u64, report: &mut Report) {
    let short = verify_cursors(api, channels, want).await;
    if !short.is_empty() {
        let examples: Vec<&str> = short.iter().take(EXAMPLES).map(String::as_str).collect();
        report.fail(format!(
            "{} of {} users' cursors did not reach seq {want} (acks not stored): {}",
            short.len(),
            channels.len(),
            examples.join(" | ")
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_and_rates_need_both_ends() {
        assert_eq!(span_s(Some(1_000_000), Some(3_500_000)), Some(2.5));
        assert_eq!(span_s(None, Some(3_500_000)), None);
        assert_eq!(span_s(Some(4_000_000), Some(3_500_000)), None);
        assert_eq!(span_s(Some(1), Some(1)), None);
        assert_eq!(rate_per_s(1000, Some(2.5)), Some(400.0));
        assert_eq!(rate_per_s(1000, None), None);
        assert_eq!(rss_per_conn(Some(10_000), Some(14_000), 1000), Some(4.0));
        assert_eq!(rss_per_conn(None, Some(14_000), 1000), None);
    }
}
