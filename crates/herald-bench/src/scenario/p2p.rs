//! `p2p`: N users, each subscribed to its own channel (`--namespace`,
//! default `user:`), every user getting `ceil(M / N)` messages addressed to
//! it, round-robin. Publishers: `--publishers` concurrent HTTP publishers
//! (one request in flight each), or with `--publish-via ws`
//! `--ws-publishers` pipelined WebSocket connections (default one, writing
//! back to back within `--window`). Users are split between the publishers
//! so each channel has a single sequential publisher (its order is then
//! well defined). Deliveries/s and publish→deliver latency.

use std::time::Duration;

use crate::fleet::Fleet;
use crate::proc_stats::CpuSnapshot;
use crate::report::{round2, Report};
use crate::worker::wire::{Layout, WorkerSpec};

use super::{per_user, publish_per_user, publish_pipelined, Ctx, Measured, Publishing};
use crate::args::PublishVia;

pub async fn run(ctx: &Ctx<'_>) -> anyhow::Result<Report> {
    let args = ctx.args;
    let n = args.connections();
    let rounds = per_user(args.messages.unwrap_or(20_000), n);
    let rate = *args.rates()?.first().expect("rates() is never empty");
    let ws = args.publish_via == PublishVia::Ws;
    let publishers = if ws { args.ws_publishers } else { args.publishers() }.min(n);
    let layout = Layout::PerUser { prefix: format!("{}:", args.namespace()) };
    let planned = rate.interval(1).map_or(Duration::ZERO, |iv| iv.mul_f64((rounds * n as u64) as f64));
    let plan = ctx.fleet_plan(layout.clone(), true, ctx.lifetime(2, planned));
    let mut fleet = Fleet::start(args, plan).await?;
    println!("   {} users subscribed; {publishers} publishers, {rounds} messages per user", fleet.connected);
    ctx.settle_cross_node().await;

    let mut report = ctx.fleet_report(&fleet, rounds * n as u64, rate);
    report.namespace = Some(args.namespace().to_owned());
    report.publishers = Some(publishers as u64);
    report.expected = rounds * n as u64;

    let channels: Vec<String> = (0..n).map(|i| WorkerSpec::channel(&layout, &ctx.run_id, i)).collect();
    let measured = Measured::start(args, &fleet)?;
    let started = measured.started;
    let deadline = started + args.timeout;
    let (published, mut errors, answers) = if ws {
        let stats = publish_pipelined(ctx, &channels, (0, rounds), rate, publishers, deadline).await;
        (stats.acked, stats.errors, Some(stats.latency))
    } else {
        let Publishing { published, errors, .. } =
            publish_per_user(ctx, &channels, (0, rounds), rate, publishers, false, deadline).await?;
        (published, errors, None)
    };
    let publish_secs = started.elapsed().as_secs_f64();
    // Publishing stopped early: what is missing will not come.
    let wait = if errors.is_empty() { args.timeout } else { Duration::from_secs(5) };
    let tally = fleet.collect(rounds, wait).await?;
    let w1 = CpuSnapshot::take(args.server_pid, fleet.client_sample())?;
    fleet.stop().await;

    measured.finish(&mut report, &w1, &tally);
    report.publishes_per_s = Some(round2(published as f64 / publish_secs.max(1e-9)));
    report.apply_publishing(args, answers.as_ref());
    if !errors.is_empty() {
        errors.truncate(3);
        report.fail(format!(
            "publishing stopped early ({published} of {} sent; unsent ones count as lost): {}",
            report.expected,
            errors.join(" | ")
        ));
    }
    Ok(report)
}
