//! One connection task of a worker: open and subscribe, then loop over the
//! control channel, a scheduled drop, and the next server event. Every
//! wait is bounded; a connection that cannot be reopened stays closed and
//! shows up as incomplete in the next collect.

use std::sync::atomic::{AtomicUsize, Ordering};
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

/// One connection's identity within the worker.
struct Slot {
    shared: Arc<Shared>,
    /// Index within this worker.
    i: usize,
    /// Index within the whole run.
    global: usize,
    user: String,
    channel: String,
    /// Times this connection moved to another node (a cluster's node went
    /// away): picks its node with [`crate::worker::wire::node_for`].
    hops: AtomicUsize,
}

/// Most events handled in one go before the control channel (stop, drop
/// rounds) is checked again.
const DRAIN_MAX: usize = 256;

pub(super) async fn run(
    shared: Arc<Shared>,
    i: usize,
    sem: Arc<Semaphore>,
    done_tx: mpsc::UnboundedSender<Result<(), String>>,
) {
    let spec = &shared.spec;
    let global = spec.first + i;
    let slot = Slot {
        user: WorkerSpec::user(&spec.run_id, global),
        channel: WorkerSpec::channel(&spec.layout, &spec.run_id, global),
        shared: shared.clone(),
        i,
        global,
        hops: AtomicUsize::new(0),
    };
    let mut ctl = shared.control.subscribe();
    let mut conn = {
        let Ok(_permit) = sem.acquire().await else { return };
        match slot.open(FIRST_ATTEMPTS).await {
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
                conn = slot.planned_reconnect(pause).await;
            }
            first = next_opt(&mut conn) => {
                // This event, then those already read from the socket (at
                // most DRAIN_MAX), before the control channel is looked at
                // again: one select per burst instead of per message.
                let mut next = Some(first);
                let mut handled = 0;
                while let Some(event) = next.take() {
                    handled += 1;
                    match event {
                        Ok(Some(Incoming::Delivery { stamp, seq, redelivered })) => {
                            shared.on_delivery(i, stamp, seq, redelivered)
                        }
                        Ok(Some(Incoming::Acked { seq })) => shared.on_ack(i, seq),
                        Ok(Some(Incoming::Closing(reason))) => {
                            shared.with_period(|t| {
                                t.note_error(format!("connection {global}: server closing: {reason}"))
                            });
                        }
                        Ok(None) => {
                            drop(conn.take());
                            conn = slot.after_loss("connection ended".to_owned()).await;
                            break;
                        }
                        Err(e) => {
                            drop(conn.take());
                            conn = slot.after_loss(format!("{e:#}")).await;
                            break;
                        }
                    }
                    if handled < DRAIN_MAX {
                        next = futures_util::FutureExt::now_or_never(next_opt(&mut conn));
                    }
                }
            }
        }
    }
}

impl Slot {
    /// Open and subscribe, resuming from the subscription's last seq,
    /// retrying with jittered backoff until `attempts` or the phase
    /// deadline run out.
    async fn open(&self, attempts: u32) -> anyhow::Result<SubConn> {
        let shared = &*self.shared;
        let deadline = Instant::now() + Duration::from_millis(shared.spec.phase_timeout_ms);
        let mut backoff = Duration::from_millis(50);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let resume = lock(&shared.subs[self.i]).resume.clone();
            let endpoint = shared.spec.endpoint(self.global, self.hops.load(Ordering::Relaxed));
            let opened =
                SubConn::open(endpoint, shared.spec.source, &self.user, &self.channel, &resume).await;
            match opened {
                Ok((conn, subscribed)) => {
                    let first = {
                        let mut sub = lock(&shared.subs[self.i]);
                        // Nothing received yet: everything after the start
                        // of this first subscribe is ours (the head, or on
                        // an acked channel the start of the offline inbox).
                        let first = sub.resume.last_seq.is_none();
                        if first {
                            sub.resume.last_seq = subscribed.start_after();
                            sub.subscribed(subscribed.sent_us);
                        }
                        if subscribed.epoch.is_some() {
                            sub.resume.epoch = subscribed.epoch;
                        }
                        first
                    };
                    if first {
                        if let Some(unread) = subscribed.unread {
                            shared.with_period(|t| t.unread_at_subscribe += unread);
                        }
                    }
                    if let Some(gap) = subscribed.gap_reported {
                        shared.with_period(|t| {
                            t.gaps_reported += 1;
                            t.note_error(format!("{}: {gap}", self.user));
                        });
                    }
                    shared.live.fetch_add(1, Ordering::AcqRel);
                    return Ok(conn);
                }
                Err(e) => {
                    // Away from its first node already: the next one may
                    // be gone too, so each retry tries another.
                    if self.hops.load(Ordering::Relaxed) > 0 {
                        self.hops.fetch_add(1, Ordering::Relaxed);
                    }
                    if attempt >= attempts || Instant::now() + backoff >= deadline {
                        return Err(e.context(format!("gave up after {attempt} attempt(s)")));
                    }
                    {
                        let mut r = lock(&shared.retries);
                        r.0 += 1;
                        r.1.get_or_insert_with(|| format!("{}: {e:#}", self.user));
                    }
                    tokio::time::sleep(jitter(backoff) + backoff / 2).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// A drop of the current round: wait `pause`, reconnect and resume,
    /// and count it in the round.
    async fn planned_reconnect(&self, pause: Duration) -> Option<SubConn> {
        self.shared.with_round(|r, _| r.dropped += 1);
        tokio::time::sleep(pause).await;
        let started = Instant::now();
        match self.open(u32::MAX).await {
            Ok(c) => {
                let took = started.elapsed().as_micros() as u64;
                self.shared.with_round(|r, h| {
                    r.resumed += 1;
                    r.last_resumed_us = r.last_resumed_us.max(Some(payload::now_micros()));
                    h.record(took);
                });
                Some(c)
            }
            Err(e) => {
                self.shared.with_round(|r, _| {
                    r.failed += 1;
                    if r.errors.len() < crate::tally::MAX_ERRORS {
                        r.errors.push(format!("connection {}: {e:#}", self.global));
                    }
                });
                None
            }
        }
    }

    /// The server or the network ended the connection: count it, and
    /// resume if the scenario says so.
    async fn after_loss(&self, why: String) -> Option<SubConn> {
        let shared = &*self.shared;
        shared.live.fetch_sub(1, Ordering::AcqRel);
        shared.with_period(|t| {
            t.disconnects += 1;
            t.note_error(format!("connection {} lost: {why}", self.global));
        });
        if !shared.spec.resume {
            return None;
        }
        // Resume on another node: this one may be gone (one server: the same).
        self.hops.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(jitter(Duration::from_millis(shared.spec.resume_jitter_ms))).await;
        match self.open(u32::MAX).await {
            Ok(c) => {
                let now = payload::now_micros();
                shared.with_period(|t| {
                    t.resumes += 1;
                    t.last_resume_us = t.last_resume_us.max(Some(now));
                });
                Some(c)
            }
            Err(e) => {
                shared.with_period(|t| {
                    t.note_error(format!("connection {}: resume failed: {e:#}", self.global))
                });
                None
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
