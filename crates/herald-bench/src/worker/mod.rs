//! A worker process: holds up to a few thousand subscribed connections from
//! one source address, verifies every delivery and reports to the parent.
//!
//! The bench re-executes itself as `herald bench worker` because one
//! process may open only so many files (20,000 here), and spreads workers
//! over source addresses so no (source, destination) pair runs out of
//! ephemeral ports. A worker runs on a single-threaded runtime; all shared
//! state sits behind uncontended mutexes. It exits when told, when the
//! parent goes away (stdin closes), or when its lifetime is over.

mod conn;
pub mod wire;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::time::Instant;

use crate::hist::Histogram;
use crate::payload::{self, Stamp};
use crate::tally::{SubCheck, Tally};
use wire::{Command, Event, ReconnectTally, WorkerSpec};

/// How often a worker checks whether a period is complete.
const POLL: Duration = Duration::from_millis(20);

/// What every connection task is told to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Control {
    Run,
    /// Round `round`: drop at a random moment within `window`, pause up to
    /// `pause`, reconnect.
    Drop {
        round: u64,
        window: Duration,
        pause: Duration,
    },
    Stop,
}

#[derive(Default)]
struct Period {
    tally: Tally,
    hist: Histogram,
}

#[derive(Default)]
struct Round {
    tally: ReconnectTally,
    hist: Histogram,
}

pub(crate) struct Shared {
    spec: WorkerSpec,
    subs: Vec<Mutex<SubCheck>>,
    period: Mutex<Period>,
    round: Mutex<Round>,
    control: watch::Sender<Control>,
    /// Connections currently open.
    live: AtomicUsize,
    /// Failed attempts that were retried, and the first one's error.
    retries: Mutex<(u64, Option<String>)>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in a connection task cannot leave these half-updated in a way
    // that matters for counting; keep going.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn on_delivery(&self, i: usize, stamp: Stamp, seq: Option<u64>, redelivered: bool) {
        let now = payload::now_micros();
        let outcome = {
            let mut sub = lock(&self.subs[i]);
            if redelivered {
                sub.check_redelivery(stamp.n, seq)
            } else {
                sub.check(stamp.n, seq)
            }
        };
        let mut p = lock(&self.period);
        let Period { tally, hist } = &mut *p;
        tally.record(outcome, hist, now.saturating_sub(stamp.t), now);
    }

    /// Connection `i` sent an ack for every seq up to `seq`.
    fn on_ack(&self, i: usize, seq: u64) {
        let now = payload::now_micros();
        lock(&self.subs[i]).on_ack(seq, now);
        lock(&self.period).tally.record_ack(now);
    }

    fn with_period(&self, f: impl FnOnce(&mut Tally)) {
        f(&mut lock(&self.period).tally);
    }

    fn with_round(&self, f: impl FnOnce(&mut ReconnectTally, &mut Histogram)) {
        let mut r = lock(&self.round);
        let Round { tally, hist } = &mut *r;
        f(tally, hist);
    }

    /// Wait until every subscription got every `n < target` (and, with
    /// `wait_acks`, acked everything it got) or the deadline, then close
    /// the period.
    async fn collect(&self, target: u64, wait_acks: bool, timeout: Duration) -> Tally {
        let deadline = Instant::now() + timeout;
        let done = |s: &SubCheck| s.next_n >= target && (!wait_acks || s.acks_cover_deliveries());
        while Instant::now() < deadline && self.subs.iter().any(|s| !done(&lock(s))) {
            tokio::time::sleep(POLL).await;
        }
        let Period { mut tally, hist } = std::mem::take(&mut *lock(&self.period));
        let mut drain = Histogram::default();
        for s in &self.subs {
            let mut s = lock(s);
            if s.next_n < target {
                tally.incomplete += 1;
            }
            if wait_acks {
                if !s.acks_cover_deliveries() {
                    tally.unacked += 1;
                }
                if let Some((start, span)) = s.take_drain_span() {
                    drain.record(span);
                    tally.first_subscribe_us = Some(tally.first_subscribe_us.map_or(start, |f| f.min(start)));
                }
            }
            tally.lost += s.settle(target);
            tally.seq_errors += std::mem::take(&mut s.seq_errors);
        }
        tally.subscriptions = self.subs.len() as u64;
        tally.latency = hist.to_wire();
        tally.drain = drain.to_wire();
        tally
    }

    /// One drop-and-reconnect round over every open connection.
    async fn drop_round(
        &self,
        round: u64,
        window: Duration,
        pause: Duration,
        timeout: Duration,
    ) -> ReconnectTally {
        *lock(&self.round) = Round::default();
        let expected = self.live.load(Ordering::Acquire) as u64;
        self.control.send_replace(Control::Drop { round, window, pause });
        let deadline = Instant::now() + window + pause + timeout;
        loop {
            let done = {
                let r = lock(&self.round);
                r.tally.dropped >= expected && r.tally.resumed + r.tally.failed >= r.tally.dropped
            };
            if done || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        let Round { mut tally, hist } = std::mem::take(&mut *lock(&self.round));
        if tally.dropped < expected {
            tally.errors.push(format!("only {} of {expected} connections dropped in time", tally.dropped));
            tally.failed += expected - tally.dropped;
        }
        tally.handshake = hist.to_wire();
        tally
    }
}

/// Entry point of `herald bench worker`.
pub fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    crate::proc_stats::raise_nofile();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let first = lines.next_line().await?.context("worker: no spec on stdin")?;
    let spec: WorkerSpec = serde_json::from_str(&first).context("worker: bad spec")?;
    let lifetime = Instant::now() + Duration::from_millis(spec.lifetime_ms);
    let (control, _) = watch::channel(Control::Run);
    let count = spec.count;
    let shared = Arc::new(Shared {
        subs: (0..count).map(|_| Mutex::new(SubCheck::default())).collect(),
        period: Mutex::default(),
        round: Mutex::default(),
        control,
        live: AtomicUsize::new(0),
        retries: Mutex::default(),
        spec,
    });
    let mut out = tokio::io::stdout();

    let ready = connect_all(&shared).await;
    send(&mut out, &ready).await?;

    let mut round = 0;
    loop {
        let line = tokio::select! {
            line = lines.next_line() => line?,
            () = tokio::time::sleep_until(lifetime) => {
                eprintln!("herald bench worker: lifetime over, exiting");
                break;
            }
        };
        let Some(line) = line else { break }; // the parent is gone
        let cmd: Command =
            serde_json::from_str(&line).with_context(|| format!("worker: bad command {line}"))?;
        let event = match cmd {
            Command::Collect { target_n, wait_acks, timeout_ms } => {
                let tally = shared.collect(target_n, wait_acks, Duration::from_millis(timeout_ms)).await;
                Event::Collected { tally }
            }
            Command::Drop { window_ms, pause_ms, timeout_ms } => {
                round += 1;
                let ms = Duration::from_millis;
                let tally = shared.drop_round(round, ms(window_ms), ms(pause_ms), ms(timeout_ms)).await;
                Event::Reconnected { tally }
            }
            Command::Stop => {
                shared.control.send_replace(Control::Stop);
                // Let the tasks send their close frames (each bounded).
                let deadline = Instant::now() + Duration::from_secs(2);
                while shared.live.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
                    tokio::time::sleep(POLL).await;
                }
                send(&mut out, &Event::Stopped).await?;
                break;
            }
        };
        send(&mut out, &event).await?;
    }
    Ok(())
}

/// Open every connection (a bounded number of handshakes at a time) and
/// wait for each one's first outcome, within the phase timeout.
async fn connect_all(shared: &Arc<Shared>) -> Event {
    let count = shared.spec.count;
    let sem = Arc::new(Semaphore::new(shared.spec.connect_concurrency));
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    for i in 0..count {
        tokio::spawn(conn::run(shared.clone(), i, sem.clone(), done_tx.clone()));
    }
    drop(done_tx);
    let deadline = Instant::now() + Duration::from_millis(shared.spec.phase_timeout_ms);
    let (mut connected, mut failed, mut errors) = (0u64, 0u64, Vec::new());
    while connected + failed < count as u64 {
        match tokio::time::timeout_at(deadline, done_rx.recv()).await {
            Ok(Some(Ok(()))) => connected += 1,
            Ok(Some(Err(e))) => {
                failed += 1;
                if errors.len() < crate::tally::MAX_ERRORS {
                    errors.push(e);
                }
            }
            Ok(None) => break,
            Err(_) => {
                errors.push(format!(
                    "{} connections still opening at the deadline",
                    count as u64 - connected - failed
                ));
                failed = count as u64 - connected;
                break;
            }
        }
    }
    let (retried, retry_error) = std::mem::take(&mut *lock(&shared.retries));
    Event::Ready { connected, failed, errors, retried, retry_error }
}

async fn send(out: &mut tokio::io::Stdout, event: &Event) -> anyhow::Result<()> {
    let mut line = serde_json::to_vec(event)?;
    line.push(b'\n');
    out.write_all(&line).await.context("worker: cannot write to the parent")?;
    out.flush().await?;
    Ok(())
}
