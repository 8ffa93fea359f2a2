//! One connection task of a worker: open and subscribe, then loop over the
//! control channel, a scheduled drop, and the next server event. Every
//! wait is bounded; a connection that cannot be reopened stays closed and
//! shows up as incomplete in the next collect.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;

use super::{lock, Control, Shared};
use crate::payload;
use crate::protocol::{Incoming, SubConn};
use crate::worker::wire::WorkerSpec;

/// Attempts for the first open (a loaded server may refuse a few).
const FIRST_ATTEMPTS: u32 = 3;

pub(super) async fn run(
    shared: Arc<Shared>,
    i: usize,
    sem: Arc<Semaphore>,
    done_tx: mpsc::UnboundedSender<Result<(), String>>,
) {
    let spec = &shared.spec;
    let global = spec.first + i;
    let user = WorkerSpec::user(&spec.run_id, global);
    let channel = WorkerSpec::channel(&spec.layout, &spec.run_id, global);
    let mut ctl = shared.control.subscribe();
    let mut conn = {
        let Ok(_permit) = sem.acquire().await else { return };
        let deadline = Instant::now() + Duration::from_millis(spec.phase_timeout_ms);
        match open(&shared, i, &user, &channel, deadline, FIRST_ATTEMPTS).await {
            Ok(c) => {
                let _ = done_tx.send(Ok(()));
                Some(c)
            }
            Err(e) => {
                let _ = done_tx.send(Err(format!("connection {global}: {e:#}")));
                None
            }
        }
    };
    drop(done_tx);
    let mut seen_round = 0;
    let mut planned_drop: Option<(Instant, Duration)> = None;
    loop {
        tokio::select! {
            biased;
            changed = ctl.changed() => {
                if changed.is_err() {
                    return;
                }
                let control = *ctl.borrow_and_update();
                match control {
                    Control::Stop => {
                        if let Some(c) = conn.take() {
                            c.close().await;
                            shared.live.fetch_sub(1, Ordering::AcqRel);
                        }
                        return;
                    }
                    Control::Drop { round, window, pause } if round != seen_round => {
                        seen_round = round;
                        if conn.is_some() {
                            planned_drop = Some((Instant::now() + jitter(window), jitter(pause)));
                        }
                    }
                    _ => {}
                }
            }
            () = sleep_until_opt(planned_drop.map(|(at, _)| at)) => {
                let (_, pause) = planned_drop.take().expect("armed only when planned");
                // Abrupt: no close frame, as when a network path dies.
                if conn.take().is_some() {
                    shared.live.fetch_sub(1, Ordering::AcqRel);
                }
                shared.with_round(|r, _| r.dropped += 1);
                tokio::time::sleep(pause).await;
                let started = Instant::now();
                let deadline = started + Duration::from_millis(spec.phase_timeout_ms);
                match open(&shared, i, &user, &channel, deadline, u32::MAX).await {
                    Ok(c) => {
                        conn = Some(c);
                        let took = started.elapsed().as_micros() as u64;
                        shared.with_round(|r, h| {
                            r.resumed += 1;
                            r.last_resumed_us = r.last_resumed_us.max(Some(payload::now_micros()));
                            h.record(took);
                        });
                    }
                    Err(e) => shared.with_round(|r, _| {
                        r.failed += 1;
                        if r.errors.len() < crate::tally::MAX_ERRORS {
                            r.errors.push(format!("connection {global}: {e:#}"));
                        }
                    }),
                }
            }
            event = next_opt(&mut conn) => match event {
                Ok(Some(Incoming::Delivery { stamp, seq })) => shared.on_delivery(i, stamp, seq),
                Ok(Some(Incoming::Closing(reason))) => {
                    shared.with_period(|t| t.note_error(format!("connection {global}: server closing: {reason}")));
                }
                Ok(None) | Err(_) => {
                    let why = match event {
                        Err(e) => format!("{e:#}"),
                        _ => "connection ended".to_owned(),
                    };
                    conn = None;
                    shared.live.fetch_sub(1, Ordering::AcqRel);
                    shared.with_period(|t| {
                        t.disconnects += 1;
                        t.note_error(format!("connection {global} lost: {why}"));
                    });
                    if spec.resume {
                        let deadline = Instant::now() + Duration::from_millis(spec.phase_timeout_ms);
                        match open(&shared, i, &user, &channel, deadline, u32::MAX).await {
                            Ok(c) => {
                                conn = Some(c);
                                shared.with_period(|t| t.resumes += 1);
                            }
                            Err(e) => shared.with_period(|t| t.note_error(format!("connection {global}: resume failed: {e:#}"))),
                        }
                    }
                }
            }
        }
    }
}

/// Open and subscribe, resuming from the subscription's last seq, retrying
/// with jittered backoff until `attempts` or the deadline run out.
async fn open(
    shared: &Shared,
    i: usize,
    user: &str,
    channel: &str,
    deadline: Instant,
    attempts: u32,
) -> anyhow::Result<SubConn> {
    let mut backoff = Duration::from_millis(50);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let resume = lock(&shared.subs[i]).resume.clone();
        match SubConn::open(&shared.spec.endpoint, shared.spec.source, user, channel, &resume).await {
            Ok((conn, subscribed)) => {
                {
                    let mut sub = lock(&shared.subs[i]);
                    // Nothing received yet: everything after the head at
                    // this first subscribe is ours.
                    if sub.resume.last_seq.is_none() {
                        sub.resume.last_seq = subscribed.head;
                    }
                    if subscribed.epoch.is_some() {
                        sub.resume.epoch = subscribed.epoch;
                    }
                }
                if let Some(gap) = subscribed.gap_reported {
                    shared.with_period(|t| {
                        t.gaps_reported += 1;
                        t.note_error(format!("{user}: {gap}"));
                    });
                }
                shared.live.fetch_add(1, Ordering::AcqRel);
                return Ok(conn);
            }
            Err(e) => {
                if attempt >= attempts || Instant::now() + backoff >= deadline {
                    return Err(e.context(format!("gave up after {attempt} attempt(s)")));
                }
                {
                    let mut r = lock(&shared.retries);
                    r.0 += 1;
                    r.1.get_or_insert_with(|| format!("{user}: {e:#}"));
                }
                tokio::time::sleep(jitter(backoff) + backoff / 2).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// A uniformly random duration in `[0, max)`.
fn jitter(max: Duration) -> Duration {
    let ms = max.as_millis() as u64;
    if ms == 0 {
        return Duration::ZERO;
    }
    Duration::from_millis(fastrand::u64(0..ms))
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn next_opt(conn: &mut Option<SubConn>) -> anyhow::Result<Option<Incoming>> {
    match conn {
        Some(c) => c.next().await,
        None => std::future::pending().await,
    }
}
