//! The scheduler: appends scheduled messages when they are due.
//!
//! One task per node, like the room keeper: it holds no timer per schedule
//! (the engine keeps them ordered by `(deliver_at, schedule order)`), only
//! the time of the next one, and sleeps until then, at most
//! [`POLL_INTERVAL`] (another node may have added an earlier one, or died
//! holding a claim) and less when this node adds an earlier schedule
//! ([`Wake::added`]). When it wakes it claims what is due, page by page,
//! oldest first, and delivers each claim: the engine appends the message
//! and removes the schedule in one atomic step, refused when the claim was
//! fenced off, so every schedule is appended once whatever node dies or
//! pauses when. After a restart, overdue schedules go out at once, in
//! order.
//!
//! Within a page, claims of one channel are delivered one after the other
//! (so they get seqs in schedule order) and channels concurrently.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use herald_core::{AppendRequest, Claim, Delivered, EngineError};
use herald_proto::{ChannelName, FrameKind};
use tokio::sync::Notify;

use crate::rooms::now_ms;
use crate::state::AppState;

/// Longest sleep between two looks at the engine.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Schedules claimed per step.
const CLAIM_PAGE: usize = 512;
/// How long a claim holds before another node may take the schedule over.
/// Correctness does not depend on it (a late delivery is fenced off); it
/// bounds how late a schedule is when the node holding it dies.
pub const CLAIM_LEASE: Duration = Duration::from_secs(5);
/// Channels delivered concurrently within a page.
const CHANNELS_IN_FLIGHT: usize = 64;
/// Wait after an engine error.
const ERROR_BACKOFF: Duration = Duration::from_millis(500);

/// Wakes the scheduler early for a schedule earlier than its next wake-up.
#[derive(Default)]
pub struct Wake {
    notify: Notify,
    /// The time the scheduler sleeps until (ms), `u64::MAX` when idle.
    until: AtomicU64,
}

impl Wake {
    /// A schedule for `deliver_at` was stored on this node.
    pub fn added(&self, deliver_at: u64) {
        if deliver_at < self.until.load(Ordering::Acquire) {
            self.notify.notify_one();
        }
    }
}

/// The scheduler task; returns on shutdown.
pub async fn run(state: Arc<AppState>) {
    let mut failing = false;
    loop {
        if state.shutdown.is_cancelled() {
            return;
        }
        let wait = match step(&state).await {
            Ok(wait) => {
                if failing {
                    failing = false;
                    tracing::info!("scheduler recovered");
                }
                wait
            }
            Err(e) => {
                if !failing {
                    failing = true;
                    tracing::warn!(error = %e, "scheduler failing; retrying");
                } else {
                    tracing::debug!(error = %e, "scheduler still failing");
                }
                ERROR_BACKOFF
            }
        };
        if wait.is_zero() {
            tokio::task::yield_now().await;
            continue;
        }
        state.scheduler.until.store(now_ms() + wait.as_millis() as u64, Ordering::Release);
        tokio::select! {
            () = state.shutdown.cancelled() => return,
            () = state.scheduler.notify.notified() => {}
            () = tokio::time::sleep(wait) => {}
        }
        state.scheduler.until.store(0, Ordering::Release);
    }
}

/// Deliver one page of due schedules; returns how long to sleep.
async fn step(state: &Arc<AppState>) -> Result<Duration, EngineError> {
    let now = now_ms();
    let claims = state.engine.schedules_claim(now, CLAIM_PAGE, CLAIM_LEASE).await?;
    let n = claims.len();
    if n > 0 {
        deliver_page(state, claims).await;
    }
    if let Ok(p) = state.engine.schedules_pending().await {
        state.metrics.scheduled_pending.set(i64::try_from(p).unwrap_or(i64::MAX));
    }
    if n == CLAIM_PAGE {
        return Ok(Duration::ZERO);
    }
    let claimed_at = now;
    let now = now_ms();
    Ok(match state.engine.schedule_next().await? {
        // Became due since the claim: at once.
        Some(t) if t > claimed_at && t <= now => Duration::ZERO,
        // Due at the claim but not claimed: held by another node (or
        // delivered meanwhile): look again soon.
        Some(t) if t <= now => Duration::from_millis(if n > 0 { 0 } else { 50 }),
        Some(t) => Duration::from_millis(t - now).min(POLL_INTERVAL),
        None => POLL_INTERVAL,
    })
}

async fn deliver_page(state: &Arc<AppState>, claims: Vec<Claim>) {
    // Per channel in claim order (which is schedule order).
    let mut order: Vec<ChannelName> = Vec::new();
    let mut by_channel: HashMap<ChannelName, Vec<Claim>> = HashMap::new();
    for c in claims {
        let list = by_channel.entry(c.schedule.channel.clone()).or_default();
        if list.is_empty() {
            order.push(c.schedule.channel.clone());
        }
        list.push(c);
    }
    futures_util::stream::iter(order)
        .for_each_concurrent(CHANNELS_IN_FLIGHT, |ch| {
            let list = by_channel.remove(&ch).unwrap_or_default();
            async move {
                for c in list {
                    deliver(state, &c).await;
                }
            }
        })
        .await;
}

/// Deliver one claim. Failures leave the schedule pending: the claim
/// expires and it is claimed again.
async fn deliver(state: &AppState, claim: &Claim) {
    let s = &claim.schedule;
    let Ok(ns) = state.config().namespaces.resolve(&s.channel) else {
        tracing::warn!(channel = %s.channel, id = %s.id, "scheduled message for a namespace no longer configured; cancelled");
        cancel(state, &s.id).await;
        return;
    };
    // As for any publish: the webhooks' cursors before the append, so a
    // channel whose first message is a scheduled one is not missed after a
    // crash (webhooks/mod.rs). A failure leaves the schedule pending.
    if let Err(e) = state.webhooks.ensure(&*state.engine, ns, &s.channel).await {
        tracing::warn!(channel = %s.channel, error = %e, "scheduled delivery waits for the engine; retrying");
        return;
    }
    let req = AppendRequest {
        meta: s.meta.clone(),
        kind: FrameKind::Message,
        ..AppendRequest::message(s.channel.clone(), s.data.clone(), ns.is_durable(), ns.retention())
    };
    match state.engine.schedule_deliver(claim, req).await {
        Ok(Delivered::Appended(_)) => {
            state.webhooks.appended(&s.channel);
            state.metrics.scheduled_delivered.inc();
            state.metrics.published.inc();
            let late = now_ms().saturating_sub(s.deliver_at);
            state.metrics.scheduled_lateness.observe(late as f64 / 1000.0);
        }
        Ok(Delivered::Stale) => {}
        Err(EngineError::Closed) => {
            tracing::debug!(channel = %s.channel, id = %s.id, "scheduled message for a closed channel; cancelled");
            cancel(state, &s.id).await;
        }
        Err(e) => tracing::warn!(channel = %s.channel, error = %e, "scheduled delivery failed; retrying"),
    }
}

async fn cancel(state: &AppState, id: &str) {
    match state.engine.schedule_cancel(id).await {
        Ok(Some(_)) => {
            state.metrics.scheduled_cancelled.inc();
        }
        Ok(None) => {}
        Err(e) => tracing::warn!(error = %e, "cancelling a schedule failed"),
    }
}
