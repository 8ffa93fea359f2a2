//! `scheduled` (Herald only): `--messages` scheduled publishes (default
//! 100,000) from `--publishers` concurrent HTTP publishers, one channel
//! each, with `deliver_at` spread evenly over `--spread` starting `--lead`
//! after the start. Then it waits until every schedule is due and no
//! channel has one pending, and reads every channel's log.
//!
//! Verified: every schedule appended exactly once (by the `n` in its data),
//! none before its `deliver_at`. Reported: scheduling requests/s and, as
//! the latency figures, the **lateness** of each append (the message's `ts`
//! minus its `deliver_at`, both server clock).

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use herald_client::{DeliverAt, HttpApi};
use serde_json::json;
use tokio::time::Instant;

use crate::hist::Histogram;
use crate::report::{round2, Report};

use super::Ctx;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

struct Lane {
    channel: String,
    scheduled: u64,
    error: Option<String>,
}

pub async fn run(ctx: &Ctx<'_>) -> anyhow::Result<Report> {
    let args = ctx.args;
    let Some(api) = ctx.publishers.herald_api() else { bail!("`scheduled` runs against Herald only") };
    let total = args.messages.unwrap_or(100_000);
    let publishers = args.publishers().min(total.max(1) as usize);
    let mut report = ctx.report();
    report.publishers = Some(publishers as u64);
    report.messages = Some(total);
    report.rate = Some("max".into());
    report.expected = total;
    report.checks = "every schedule appended exactly once, none early (each channel's log read back); \
                     latency figures = lateness (append ts - deliver_at)";

    let started = Instant::now();
    let base = now_ms() + args.lead.as_millis() as u64;
    let spread = args.spread.as_millis() as u64;
    let at_of = move |j: u64| base + j * spread / total.max(1);
    let deadline = started + args.lead + args.spread + args.timeout;
    let mut tasks = Vec::with_capacity(publishers);
    for k in 0..publishers {
        let api = api.clone();
        let channel = format!("chat:{}-s{k}", ctx.run_id);
        tasks.push(tokio::spawn(async move {
            let mut lane = Lane { channel, scheduled: 0, error: None };
            let mut j = k as u64;
            while j < total {
                if Instant::now() >= deadline {
                    lane.error = Some("deadline reached while scheduling".into());
                    break;
                }
                let at = at_of(j);
                let data = json!({"n": j, "at": at});
                match api.publish_scheduled(&lane.channel, &data, None, DeliverAt::At(at), None).await {
                    Ok(_) => lane.scheduled += 1,
                    Err(e) => {
                        lane.error = Some(format!("{}: {e:#}", lane.channel));
                        break;
                    }
                }
                j += publishers as u64;
            }
            lane
        }));
    }
    let mut lanes = Vec::with_capacity(publishers);
    for t in tasks {
        lanes.push(t.await.context("publisher task panicked")?);
    }
    let scheduling = started.elapsed();
    let scheduled: u64 = lanes.iter().map(|l| l.scheduled).sum();
    for lane in &lanes {
        if let Some(e) = &lane.error {
            report.fail(format!("scheduling failed: {e}"));
        }
    }
    report.publishes_per_s = Some((scheduled as f64 / scheduling.as_secs_f64().max(1e-9)).round());
    let first_due_missed = now_ms() > base;
    eprintln!(
        "scheduled: {scheduled} schedules in {:.1}s ({}/s){}",
        scheduling.as_secs_f64(),
        report.publishes_per_s.unwrap_or(0.0),
        if first_due_missed { "; scheduling ran past the first deliver_at (raise --lead)" } else { "" }
    );

    // Wait until everything is due, then until nothing is pending.
    let last_due = at_of(total.saturating_sub(1));
    while now_ms() < last_due + 200 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let channels: Vec<String> = lanes.iter().map(|l| l.channel.clone()).collect();
    loop {
        let mut pending = 0;
        for ch in &channels {
            pending += api.scheduled(ch, Some(1)).await?.len();
        }
        if pending == 0 {
            break;
        }
        if Instant::now() >= deadline {
            report.fail(format!("{pending}+ schedules still pending at the deadline"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let elapsed = started.elapsed();

    let (lateness, seen, duplicates, early) = read_back(api, &channels).await?;
    report.delivered = seen;
    report.duplicates = duplicates;
    report.lost = scheduled.saturating_sub(seen);
    if duplicates > 0 {
        report.fail(format!("{duplicates} schedules appended more than once"));
    }
    if early > 0 {
        report.fail(format!("{early} schedules appended before their deliver_at"));
    }
    if report.lost > 0 {
        report.fail(format!("{} schedules never appended", report.lost));
    }
    report.duration_s = round2(elapsed.as_secs_f64());
    report.apply_latency(&lateness);
    eprintln!(
        "scheduled: {seen} of {scheduled} delivered once; lateness p50 {:?} ms, p99 {:?} ms, max {:?} ms",
        report.p50_ms, report.p99_ms, report.max_ms
    );
    Ok(report)
}

/// Every channel's log: lateness (µs), distinct `n` seen, duplicates, and
/// appends before their time.
async fn read_back(api: &HttpApi, channels: &[String]) -> anyhow::Result<(Histogram, u64, u64, u64)> {
    let mut lateness = Histogram::default();
    let (mut seen, mut duplicates, mut early) = (HashSet::new(), 0u64, 0u64);
    for ch in channels {
        let mut after = 0;
        loop {
            let page = api.history(ch, Some(after), Some(1000)).await?;
            let Some(last) = page.messages.last() else { break };
            after = last.seq;
            for m in &page.messages {
                let v: serde_json::Value = serde_json::from_str(m.data.get()).context("bench payload")?;
                let (n, at) = (v["n"].as_u64().unwrap_or(u64::MAX), v["at"].as_u64().unwrap_or(0));
                if !seen.insert(n) {
                    duplicates += 1;
                }
                if m.ts < at {
                    early += 1;
                }
                lateness.record(m.ts.saturating_sub(at) * 1000);
            }
        }
    }
    Ok((lateness, seen.len() as u64, duplicates, early))
}
