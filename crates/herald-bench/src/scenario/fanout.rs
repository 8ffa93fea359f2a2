//! `fanout`: N subscribers on one channel and one sequential publisher;
//! for each `--rate` (default: a fixed rate, then max), M messages of
//! `--size` bytes. One report per rate: deliveries/s (from the first
//! publish to the last delivery), publish→deliver latency, server CPU.

use std::time::Duration;

use tokio::time::Instant;

use crate::fleet::{Fleet, FleetPlan};
use crate::proc_stats::CpuSnapshot;
use crate::report::{round2, Report};
use crate::worker::wire::Layout;

use super::{per_second, publish_loop, Ctx, PublishPlan};

pub async fn run(ctx: &Ctx<'_>) -> anyhow::Result<Vec<Report>> {
    let args = ctx.args;
    let n = args.connections();
    let m = args.messages.unwrap_or(200);
    let rates = args.rates()?;
    let channel = format!("chat:{}", ctx.run_id);
    let planned: f64 = rates.iter().filter_map(|r| r.interval(1)).map(|iv| iv.as_secs_f64() * m as f64).sum();
    let plan = FleetPlan {
        endpoint: ctx.endpoint.clone(),
        run_id: ctx.run_id.clone(),
        connections: n,
        layout: Layout::Shared { channel: channel.clone() },
        resume: true,
        lifetime: ctx.lifetime(rates.len() as u32 + 1, Duration::from_secs_f64(planned)),
    };
    let mut fleet = Fleet::start(args, plan).await?;
    println!("   {} subscribers on {channel}", fleet.connected);
    let mut publisher = ctx.publishers.connect().await?;
    let channels = [channel];
    let mut reports = Vec::new();
    let mut n0 = 0;
    for rate in rates {
        let mut report = ctx.report();
        report.connections = n as u64;
        report.workers = fleet.len() as u64;
        report.messages = Some(m);
        report.rate = Some(rate.label());
        report.size = Some(args.size as u64);

        let w0 = CpuSnapshot::take(args.server_pid, fleet.client_sample())?;
        let start_us = crate::payload::now_micros();
        let started = Instant::now();
        let stats = publish_loop(
            &mut publisher,
            PublishPlan {
                channels: &channels,
                n0,
                rounds: m,
                size: args.size,
                interval: rate.interval(1),
                deadline: started + args.timeout,
                keep_acks: false,
                idempotency_keys: false,
            },
        )
        .await;
        // A failed publish stops the phase: expect what was acknowledged.
        let sent = stats.published;
        report.expected = n as u64 * sent;
        let tally = fleet.collect(n0 + sent, args.timeout).await?;
        let w1 = CpuSnapshot::take(args.server_pid, fleet.client_sample())?;
        report.duration_s = round2(started.elapsed().as_secs_f64());
        report.apply_tally(&tally);
        report.apply_window(&w0, &w1);
        report.deliveries_per_s = per_second(tally.delivered, start_us, tally.last_rx_us);
        report.publishes_per_s = Some(round2(sent as f64 / stats.elapsed.as_secs_f64().max(1e-9)));
        if let Some(e) = stats.error {
            report.fail(e);
        }
        reports.push(report);
        n0 += sent;
        // Let the sockets drain before the next phase.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    fleet.stop().await;
    Ok(reports)
}
