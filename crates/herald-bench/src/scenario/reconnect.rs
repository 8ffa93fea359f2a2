//! `reconnect`: N subscribers on one channel while a publisher sends M
//! messages at `--rate`. After a warm-up every client drops its socket at a
//! random moment within `--jitter` (no close frame, as when a network path
//! dies), pauses up to half a second, reconnects and resumes with `since`.
//! Reports the time from the drop command until every client had resumed,
//! the reconnect handshake time, and verifies every client still got every
//! message once and in order.

use std::time::Duration;

use crate::fleet::Fleet;
use crate::hist::Histogram;
use crate::proc_stats::CpuSnapshot;
use crate::report::{round2, Report};
use crate::worker::wire::Layout;

use super::{publish_loop, Ctx, Measured, PublishPlan};

/// Publishing runs this long before the drops start.
const WARMUP: Duration = Duration::from_secs(2);
/// Longest pause between a drop and the reconnect.
const PAUSE: Duration = Duration::from_millis(500);

pub async fn run(ctx: &Ctx<'_>) -> anyhow::Result<Report> {
    let args = ctx.args;
    let n = args.connections();
    let m = args.messages.unwrap_or(1000);
    let rate = *args.rates()?.first().expect("rates() is never empty");
    let channel = format!("chat:{}", ctx.run_id);
    let planned = rate.interval(1).map_or(Duration::ZERO, |iv| iv.mul_f64(m as f64));
    if planned < WARMUP + args.jitter + PAUSE {
        println!(
            "   note: publishing ({planned:?}) ends before the drops do; raise --messages or lower --rate \
             to keep publishing through the reconnects"
        );
    }
    let plan = ctx.fleet_plan(Layout::Shared { channel: channel.clone() }, true, ctx.lifetime(3, planned));
    let mut fleet = Fleet::start(args, plan).await?;
    println!("   {} subscribers on {channel}; publishing {m} at {}/s", fleet.connected, rate.label());

    let mut report = ctx.fleet_report(&fleet, m, rate);

    let measured = Measured::start(args, &fleet)?;
    let factory = ctx.publishers.clone();
    let (size, interval, deadline) = (args.size, rate.interval(1), measured.started + planned + args.timeout);
    let channels = vec![channel];
    let publishing = tokio::spawn(async move {
        let mut publisher = factory.connect().await?;
        let plan = PublishPlan {
            channels: &channels,
            n0: 0,
            rounds: m,
            size,
            interval,
            deadline,
            keep_acks: false,
            idempotency_keys: false,
        };
        anyhow::Ok(publish_loop(&mut publisher, plan).await)
    });

    tokio::time::sleep(WARMUP).await;
    let drop_us = crate::payload::now_micros();
    let round = fleet.drop_all(args.jitter, PAUSE, args.timeout).await?;
    report.all_resumed_s = round.last_resumed_us.map(|t| round2(t.saturating_sub(drop_us) as f64 / 1e6));
    let handshake = Histogram::from_wire(&round.handshake);
    report.resume_p50_ms = handshake.quantile_ms(0.5);
    report.resume_p99_ms = handshake.quantile_ms(0.99);
    if round.failed > 0 || round.resumed < n as u64 {
        report.fail(format!(
            "{} of {n} clients resumed ({} failed): {}",
            round.resumed,
            round.failed,
            round.errors.join(" | ")
        ));
    }

    let stats = publishing.await??;
    let sent = stats.published;
    report.expected = n as u64 * sent;
    let tally = fleet.collect(sent, args.timeout).await?;
    let w1 = CpuSnapshot::take(args.server_pid, fleet.client_sample())?;
    fleet.stop().await;
    measured.finish(&mut report, &w1, &tally);
    if let Some(e) = stats.error {
        report.fail(e);
    }
    Ok(report)
}
