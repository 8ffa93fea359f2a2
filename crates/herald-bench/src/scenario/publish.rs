//! `publish`: `--publishers` concurrent HTTP publishers, M messages in
//! total, each with its own `Idempotency-Key`, each publisher on its own
//! channel; with `--batch N` (Herald) N messages a request, as one `POST
//! /api/v1/messages`. Publishes/s and request latency (a Herald publish is answered
//! after the group-commit fsync).
//!
//! Verified afterwards, outside the timed part (Herald): every channel's
//! seqs are exactly 1..=count, the log head agrees, and replaying one
//! request per publisher with its key returns the original seq with
//! `Idempotent-Replayed: true`.

use anyhow::Context;
use tokio::time::Instant;

use crate::hist::Histogram;
use crate::payload;
use crate::proc_stats::{sample, CpuSnapshot};
use crate::publisher::{Ack, PublisherFactory};
use crate::report::{round2, Report};

use super::Ctx;

/// One publisher's results.
struct Lane {
    channel: String,
    latency: Histogram,
    acks: Vec<Ack>,
    /// The first request, to replay.
    first: Option<(String, Vec<u8>)>,
    error: Option<String>,
}

pub async fn run(ctx: &Ctx<'_>) -> anyhow::Result<Report> {
    let args = ctx.args;
    let total = args.messages.unwrap_or(20_000);
    let publishers = args.publishers().min(total.max(1) as usize);
    let mut report = ctx.report();
    report.publishers = Some(publishers as u64);
    report.messages = Some(total);
    report.rate = Some("max".into());
    report.size = Some(args.size as u64);
    report.expected = total;
    report.checks = match ctx.publishers {
        PublisherFactory::Herald { .. } => {
            "every publish acknowledged; per-channel seqs exactly 1..=n; log heads agree; \
             replays return the original seq"
        }
        _ => "every publish acknowledged",
    };

    let w0 = CpuSnapshot::take(args.server_pid, sample(std::process::id()).ok())?;
    let started = Instant::now();
    let deadline = started + args.timeout;
    let mut tasks = Vec::with_capacity(publishers);
    for k in 0..publishers {
        let count = total / publishers as u64 + u64::from((k as u64) < total % publishers as u64);
        let channel = format!("chat:{}-p{k}", ctx.run_id);
        let key_prefix = format!("{}-{k}", ctx.run_id);
        let factory = ctx.publishers.clone();
        let (size, batch) = (args.size, args.batch as u64);
        tasks.push(tokio::spawn(async move {
            let mut lane =
                Lane { channel, latency: Histogram::default(), acks: Vec::new(), first: None, error: None };
            let mut publisher = match factory.connect().await {
                Ok(p) => p,
                Err(e) => {
                    lane.error = Some(format!("{e:#}"));
                    return lane;
                }
            };
            let mut j = 0;
            while j < count {
                if Instant::now() >= deadline {
                    lane.error = Some(format!("deadline reached after {j} of {count}"));
                    break;
                }
                let n = batch.min(count - j);
                let keys: Vec<String> = (j..j + n).map(|i| format!("{key_prefix}-{i}")).collect();
                let mut bodies: Vec<Vec<u8>> = (j..j + n).map(|i| payload::encode(i, size)).collect();
                if j == 0 {
                    lane.first = Some((keys[0].clone(), bodies[0].clone()));
                }
                let sent = Instant::now();
                let acks = if batch == 1 {
                    let body = bodies.pop().expect("one message a request");
                    publisher.publish(&lane.channel, body, Some(&keys[0])).await.map(|a| vec![a])
                } else {
                    publisher.publish_batch(&lane.channel, &bodies, &keys).await
                };
                match acks {
                    Ok(acks) => {
                        // Each message's latency is its request's.
                        let took = sent.elapsed().as_micros() as u64;
                        for ack in acks {
                            lane.latency.record(took);
                            lane.acks.push(ack);
                        }
                    }
                    Err(e) => {
                        lane.error = Some(format!("{}: {e:#}", lane.channel));
                        break;
                    }
                }
                j += n;
            }
            lane
        }));
    }
    let mut lanes = Vec::with_capacity(publishers);
    for t in tasks {
        lanes.push(t.await.context("publisher task panicked")?);
    }
    let elapsed = started.elapsed();
    let w1 = CpuSnapshot::take(args.server_pid, sample(std::process::id()).ok())?;

    let mut latency = Histogram::default();
    for lane in &lanes {
        latency.merge(&lane.latency);
        if let Some(e) = &lane.error {
            report.fail(format!("publisher failed: {e}"));
        }
    }
    let published = latency.count();
    report.delivered = published;
    report.lost = total - published;
    report.duration_s = round2(elapsed.as_secs_f64());
    report.publishes_per_s = Some((published as f64 / elapsed.as_secs_f64().max(1e-9)).round());
    report.apply_latency(&latency);
    report.apply_window(&w0, &w1);
    if let PublisherFactory::Herald { .. } = ctx.publishers {
        verify_herald(ctx, &lanes, &mut report).await?;
    }
    Ok(report)
}

/// Seqs gap-free per channel, log heads, and idempotent replays.
async fn verify_herald(ctx: &Ctx<'_>, lanes: &[Lane], report: &mut Report) -> anyhow::Result<()> {
    let Some(api) = ctx.publishers.herald_api() else { return Ok(()) };
    let mut publisher = ctx.publishers.connect().await?;
    let (mut bad_seqs, mut bad_heads, mut bad_replays) = (Vec::new(), Vec::new(), Vec::new());
    for lane in lanes {
        let mut seqs: Vec<u64> = lane.acks.iter().filter_map(|a| a.seq).collect();
        seqs.sort_unstable();
        let count = lane.acks.len() as u64;
        if seqs.len() as u64 != count || seqs.iter().zip(1..).any(|(&s, want)| s != want) {
            bad_seqs.push(lane.channel.clone());
        }
        if count > 0 {
            let history = api.history(&lane.channel, Some(count - 1), Some(1)).await?;
            if history.head != count {
                bad_heads.push(format!("{} head {} (want {count})", lane.channel, history.head));
            }
        }
        if let (Some((key, body)), Some(first)) = (&lane.first, lane.acks.first()) {
            let again = publisher.publish(&lane.channel, body.clone(), Some(key)).await?;
            if !again.replayed || again.seq != first.seq {
                bad_replays.push(format!(
                    "{}: replay gave seq {:?} replayed={}",
                    lane.channel, again.seq, again.replayed
                ));
            }
        }
    }
    if !bad_seqs.is_empty() {
        report.fail(format!(
            "seqs not exactly 1..=count on {} channels, e.g. {}",
            bad_seqs.len(),
            bad_seqs[0]
        ));
    }
    if !bad_heads.is_empty() {
        report.fail(format!("log head disagrees with the acknowledged publishes: {}", bad_heads.join(", ")));
    }
    if !bad_replays.is_empty() {
        report.fail(format!("idempotent replay broken: {}", bad_replays.join(", ")));
    }
    Ok(())
}
