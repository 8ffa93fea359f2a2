//! `fanout`: N subscribers on one channel (`--namespace`, default `chat:`)
//! and one sequential publisher; for each `--rate` (default: a fixed rate,
//! then max), M messages of `--size` bytes (`--paced-messages` in the
//! fixed-rate phases). The publisher is one HTTP request in flight, or with
//! `--publish-via ws` one WebSocket connection writing back to back within
//! `--window`. One report per rate: deliveries/s (from the first publish to
//! the last delivery), publish→deliver latency, server CPU.

use std::time::Duration;

use crate::args::{PublishVia, Rate};
use crate::fleet::Fleet;
use crate::hist::Histogram;
use crate::pipelined::{PipelinePlan, WsPublisher};
use crate::proc_stats::CpuSnapshot;
use crate::publisher::Publisher;
use crate::report::{round2, Report};
use crate::worker::wire::Layout;

use super::{publish_loop, ws_publisher, Ctx, Measured, PublishPlan};

/// The one publisher of the run.
enum Sender {
    Http(Publisher),
    Ws(WsPublisher),
}

/// What one phase's publishing did.
struct Phase {
    sent: u64,
    elapsed: Duration,
    error: Option<String>,
    answers: Option<Histogram>,
}

pub async fn run(ctx: &Ctx<'_>) -> anyhow::Result<Vec<Report>> {
    let args = ctx.args;
    let n = args.connections();
    let m = args.messages.unwrap_or(200);
    let paced = args.paced_messages.unwrap_or(m);
    let rates = args.rates()?;
    let count = |rate: Rate| if matches!(rate, Rate::Max) { m } else { paced };
    let channel = format!("{}:{}", args.namespace(), ctx.run_id);
    let planned: f64 =
        rates.iter().filter_map(|&r| r.interval(1).map(|iv| iv.as_secs_f64() * count(r) as f64)).sum();
    let plan = ctx.fleet_plan(
        Layout::Shared { channel: channel.clone() },
        true,
        ctx.lifetime(rates.len() as u32 + 1, Duration::from_secs_f64(planned)),
    );
    let mut fleet = Fleet::start(args, plan).await?;
    println!("   {} subscribers on {channel}", fleet.connected);
    ctx.settle_cross_node().await;
    let mut sender = match args.publish_via {
        PublishVia::Http => Sender::Http(ctx.publishers.connect().await?),
        PublishVia::Ws => Sender::Ws(ws_publisher(ctx, 0).await?),
    };
    let channels = [channel];
    let targets = match &sender {
        Sender::Ws(p) => vec![p.target(&channels[0])],
        Sender::Http(_) => Vec::new(),
    };
    let mut reports = Vec::new();
    let mut n0 = 0;
    for rate in rates {
        let m = count(rate);
        let mut report = ctx.fleet_report(&fleet, m, rate);
        report.namespace = Some(args.namespace().to_owned());

        let measured = Measured::start(args, &fleet)?;
        let deadline = measured.started + args.timeout;
        let interval = rate.interval(1);
        let phase = match &mut sender {
            Sender::Http(publisher) => {
                let stats = publish_loop(
                    publisher,
                    PublishPlan {
                        channels: &channels,
                        n0,
                        rounds: m,
                        size: args.size,
                        interval,
                        deadline,
                        keep_acks: false,
                        idempotency_keys: false,
                    },
                )
                .await;
                Phase { sent: stats.published, elapsed: stats.elapsed, error: stats.error, answers: None }
            }
            Sender::Ws(publisher) => {
                let window = args.window;
                let plan = PipelinePlan {
                    targets: &targets,
                    n0,
                    rounds: m,
                    size: args.size,
                    interval,
                    window,
                    deadline,
                };
                let stats = publisher.run(plan).await;
                let error = (!stats.errors.is_empty()).then(|| stats.errors.join(" | "));
                Phase { sent: stats.acked, elapsed: stats.elapsed, error, answers: Some(stats.latency) }
            }
        };
        // A failed publish stops the phase: expect what was acknowledged.
        let sent = phase.sent;
        report.expected = n as u64 * sent;
        let wait = if phase.error.is_none() { args.timeout } else { Duration::from_secs(5) };
        let tally = fleet.collect(n0 + sent, wait).await?;
        let w1 = CpuSnapshot::take(args.server_pid, fleet.client_sample())?;
        measured.finish(&mut report, &w1, &tally);
        report.apply_publishing(args, phase.answers.as_ref());
        report.publishes_per_s = Some(round2(sent as f64 / phase.elapsed.as_secs_f64().max(1e-9)));
        if let Some(e) = phase.error {
            report.fail(e);
        }
        reports.push(report);
        n0 += sent;
        // Let the sockets drain before the next phase.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    if let Sender::Ws(p) = sender {
        p.close().await;
    }
    fleet.stop().await;
    Ok(reports)
}
