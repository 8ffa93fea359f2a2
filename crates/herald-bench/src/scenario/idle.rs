//! `idle`: N connections, each subscribed to its own `user:` channel (so
//! the server holds real session and hub state), held for `--hold`.
//!
//! Server RSS is read before the first connection, once all are
//! subscribed and have settled, and at the end of the hold; RSS per
//! connection is (end − before) / N. CPU is `utime + stime` over the hold. A connection the
//! server drops during the hold fails the run.

use std::time::Duration;

use crate::fleet::Fleet;
use crate::proc_stats::{maybe_sample, CpuSnapshot};
use crate::report::{round2, Report};
use crate::worker::wire::Layout;

use super::Ctx;

/// Time for the server's allocator and the last handshakes to settle
/// before the "after" reading.
const SETTLE: Duration = Duration::from_secs(3);

pub async fn run(ctx: &Ctx<'_>) -> anyhow::Result<Report> {
    let args = ctx.args;
    let n = args.connections();
    let mut report = ctx.report();
    report.connections = n as u64;
    report.namespace = Some(args.namespace().to_owned());
    report.checks = "every connection stayed open through the hold";
    let before = maybe_sample(args.server_pid)?;
    report.server_rss_before_kb = before.map(|s| s.rss_kb);

    let started = std::time::Instant::now();
    let plan = ctx.fleet_plan(
        Layout::PerUser { prefix: format!("{}:", args.namespace()) },
        false,
        ctx.lifetime(1, Duration::ZERO),
    );
    let mut fleet = Fleet::start(args, plan).await?;
    report.workers = fleet.len() as u64;
    println!(
        "   {} connections open in {:.1} s; holding for {:?}",
        fleet.connected,
        started.elapsed().as_secs_f64(),
        args.hold
    );
    tokio::time::sleep(SETTLE).await;

    let settled = CpuSnapshot::take(args.server_pid, fleet.client_sample())?;
    report.server_rss_settled_kb = settled.server.map(|s| s.rss_kb);
    tokio::time::sleep(args.hold).await;
    // RSS per connection from the end of the hold: the steady state, after
    // any garbage collection or allocator trimming the server does.
    let end = CpuSnapshot::take(args.server_pid, fleet.client_sample())?;
    report.apply_window(&settled, &end);
    if let (Some(b), Some(e)) = (before, end.server) {
        report.rss_per_conn_kb = Some(round2((e.rss_kb as f64 - b.rss_kb as f64) / n as f64));
    }
    // Nothing is published: this only counts connections lost while idle.
    let tally = fleet.collect(0, Duration::from_secs(1)).await?;
    report.duration_s = round2(started.elapsed().as_secs_f64());
    fleet.stop().await;
    if tally.disconnects > 0 {
        report.fail(format!(
            "{} idle connections were closed during the hold: {}",
            tally.disconnects,
            tally.errors.join(" | ")
        ));
    }
    report.disconnects = tally.disconnects;
    Ok(report)
}
