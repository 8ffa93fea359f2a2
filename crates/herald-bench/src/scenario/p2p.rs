//! `p2p`: N users, each subscribed to its own `user:` channel, and
//! `--publishers` concurrent HTTP publishers; every user gets
//! `ceil(M / N)` messages addressed to it. Users are split between the
//! publishers so each channel has a single sequential publisher (its order
//! is then well defined). Deliveries/s and publish→deliver latency.

use std::time::Duration;

use tokio::time::Instant;

use crate::fleet::{Fleet, FleetPlan};
use crate::proc_stats::CpuSnapshot;
use crate::report::{round2, Report};
use crate::worker::wire::{Layout, WorkerSpec};

use super::{per_second, per_user, publish_per_user, Ctx, Publishing};

pub async fn run(ctx: &Ctx<'_>) -> anyhow::Result<Report> {
    let args = ctx.args;
    let n = args.connections();
    let rounds = per_user(args.messages.unwrap_or(20_000), n);
    let rate = *args.rates()?.first().expect("rates() is never empty");
    let publishers = args.publishers().min(n);
    let layout = Layout::PerUser { prefix: format!("{}:", args.namespace) };
    let planned = rate.interval(1).map_or(Duration::ZERO, |iv| iv.mul_f64((rounds * n as u64) as f64));
    let plan = FleetPlan {
        endpoint: ctx.endpoint.clone(),
        run_id: ctx.run_id.clone(),
        connections: n,
        layout: layout.clone(),
        resume: true,
        lifetime: ctx.lifetime(2, planned),
    };
    let mut fleet = Fleet::start(args, plan).await?;
    println!("   {} users subscribed; {publishers} publishers, {rounds} messages per user", fleet.connected);

    let mut report = ctx.report();
    report.connections = n as u64;
    report.namespace = Some(args.namespace.clone());
    report.workers = fleet.len() as u64;
    report.publishers = Some(publishers as u64);
    report.messages = Some(rounds * n as u64);
    report.rate = Some(rate.label());
    report.size = Some(args.size as u64);
    report.expected = rounds * n as u64;

    let channels: Vec<String> = (0..n).map(|i| WorkerSpec::channel(&layout, &ctx.run_id, i)).collect();
    let w0 = CpuSnapshot::take(args.server_pid, fleet.client_sample())?;
    let start_us = crate::payload::now_micros();
    let started = Instant::now();
    let deadline = started + args.timeout;
    let Publishing { published, mut errors, .. } =
        publish_per_user(ctx, &channels, (0, rounds), rate, publishers, false, deadline).await?;
    let publish_secs = started.elapsed().as_secs_f64();
    let tally = fleet.collect(rounds, args.timeout).await?;
    let w1 = CpuSnapshot::take(args.server_pid, fleet.client_sample())?;
    fleet.stop().await;

    report.duration_s = round2(started.elapsed().as_secs_f64());
    report.apply_tally(&tally);
    report.apply_window(&w0, &w1);
    report.deliveries_per_s = per_second(tally.delivered, start_us, tally.last_rx_us);
    report.publishes_per_s = Some(round2(published as f64 / publish_secs.max(1e-9)));
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
