//! Ordered webhooks: every durable message of the matching channels is
//! POSTed to the backend, per channel in seq order, at least once.
//!
//! # Invariants
//!
//! - **The cursor is the truth.** Progress is the engine cursor of the
//!   subscriber `herald:webhook:<name>` on each channel (the `Cursors`
//!   concern, like an acked subscriber's). It is raised only after a 2xx
//!   answered a request holding every seq up to it, so a crash, a restart or
//!   a node's death resends (at least once, the `id` lets the backend drop
//!   a repeat) and never skips.
//! - **Every channel with work is found again.** Before the first append of
//!   a matching channel on a node ([`Webhooks::ensure`], called by the
//!   publish path and by room writes before the engine append), the
//!   webhook's cursor on it is created if missing (at the oldest retained
//!   message or at the head, as configured). So every message a webhook
//!   must deliver sits on a channel that has its cursor, durably, before
//!   the publisher hears `ok`; the deliverer lists those cursors
//!   (`Cursors::user_cursors`) every `poll_interval` and compares each with
//!   its channel's head. A local publish wakes the deliverer at once.
//! - **One request in flight per channel.** A channel has at most one
//!   worker on a node, and on the Redis engine one node at a time through
//!   an [`Ownership`](herald_core::Ownership) lease whose fencing token
//!   grows on every take-over and is sent as `Herald-Fencing-Token`. The
//!   next request of a channel is built from the cursor after the previous
//!   one succeeded, so the backend sees each channel in order.
//! - **Loss is reported.** Messages removed by retention before delivery
//!   are counted (`herald_webhook_overtaken_messages_total`), logged, and
//!   shown by `GET /api/v1/webhooks`.
//! - **Bounded.** At most `max_parallel` requests per webhook are in flight
//!   on a node and at most twice that many channels have a worker; other
//!   channels with lag wait for a worker to finish and are found by the
//!   next poll.
//! - Volatile namespaces have no log and are never delivered.

pub mod config;
pub(crate) mod sign;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herald_core::{Engine, EngineError, NamespaceOptions, Owned, Seq, SubscriberId};
use herald_proto::ChannelName;
use tokio::sync::{mpsc, Notify, Semaphore};
use tracing::Instrument;

pub use config::{StartAt, WebhookConfig};

use crate::state::AppState;

/// Channels whose cursor is known to exist, per webhook, before the cache
/// is cleared (a miss costs one cursor read).
const KNOWN_CAP: usize = 100_000;
/// Cursors listed per poll of one webhook.
const SCAN_LIMIT: usize = 100_000;
/// Wake-ups queued per webhook (a full queue is caught by the next poll).
const WAKE_QUEUE: usize = 4096;
/// The first retry delay; doubled on each failure up to `max_backoff`.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Last errors remembered per webhook, for the status API.
const ERRORS_CAP: usize = 10_000;
/// Longest error text kept.
const ERROR_TEXT: usize = 300;

/// The user of a webhook's cursors. `herald:` user ids are refused in
/// tokens, so no client can ack for a webhook.
pub fn subscriber(name: &str) -> SubscriberId {
    SubscriberId::new(format!("herald:webhook:{name}"), None).expect("webhook names make valid ids")
}

/// A channel's last failed request, for the status API.
#[derive(Debug, Clone)]
pub struct LastError {
    pub at_ms: u64,
    pub class: &'static str,
    pub message: String,
}

/// One channel's worker on this node.
struct Worker {
    retry_now: Notify,
    /// Work arrived while the worker ran: look again before leaving.
    more: AtomicBool,
}

pub struct Hook {
    pub cfg: WebhookConfig,
    pub sub: SubscriberId,
    known: Mutex<HashSet<ChannelName>>,
    wake_tx: mpsc::Sender<ChannelName>,
    wake_rx: Mutex<Option<mpsc::Receiver<ChannelName>>>,
    workers: Mutex<HashMap<ChannelName, Arc<Worker>>>,
    pub(crate) errors: Mutex<HashMap<ChannelName, LastError>>,
    permits: Semaphore,
    /// Cancelled when a reload removes or changes the webhook: its loop
    /// and channel workers end (a request in flight completes; its
    /// leases expire).
    stop: tokio_util::sync::CancellationToken,
}

impl Hook {
    fn new(cfg: WebhookConfig) -> Self {
        let (wake_tx, wake_rx) = mpsc::channel(WAKE_QUEUE);
        Hook {
            sub: subscriber(&cfg.name),
            permits: Semaphore::new(cfg.max_parallel),
            cfg,
            known: Mutex::default(),
            wake_tx,
            wake_rx: Mutex::new(Some(wake_rx)),
            workers: Mutex::default(),
            errors: Mutex::default(),
            stop: Default::default(),
        }
    }

    /// The engine lease key of this webhook's delivery of `channel`.
    fn lease_key(&self, channel: &ChannelName) -> String {
        format!("webhook:{}:{}", self.cfg.name, channel.as_str())
    }

    pub fn last_error(&self, channel: &ChannelName) -> Option<LastError> {
        self.errors.lock().expect("errors lock").get(channel).cloned()
    }

    /// Start a worker for `channel` now, or cut the backoff of its worker.
    pub fn retry(&self, channel: ChannelName) {
        if let Some(w) = self.workers.lock().expect("workers lock").get(&channel) {
            w.more.store(true, Ordering::Release);
            w.retry_now.notify_one();
            return;
        }
        let _ = self.wake_tx.try_send(channel);
    }

    fn note_error(&self, channel: &ChannelName, class: &'static str, message: String) {
        let mut errors = self.errors.lock().expect("errors lock");
        if errors.len() >= ERRORS_CAP && !errors.contains_key(channel) {
            errors.clear();
        }
        let message: String = message.chars().take(ERROR_TEXT).collect();
        errors.insert(channel.clone(), LastError { at_ms: now_ms(), class, message });
    }
}

/// Every configured webhook of this server.
pub struct Webhooks {
    /// Replaced by a reload that changes `[[webhooks]]` ([`Webhooks::replace`]).
    hooks: arc_swap::ArcSwap<Vec<Arc<Hook>>>,
    /// Tells the deliverer ([`run`]) that `hooks` changed.
    changed: Notify,
    /// This process's holder id for ownership leases.
    holder: String,
    http: reqwest::Client,
}

impl Webhooks {
    pub fn new(configs: &[WebhookConfig]) -> Self {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("an HTTP client without TLS builds");
        Webhooks {
            hooks: arc_swap::ArcSwap::from_pointee(
                configs.iter().cloned().map(|c| Arc::new(Hook::new(c))).collect(),
            ),
            changed: Notify::new(),
            holder: uuid::Uuid::new_v4().simple().to_string(),
            http,
        }
    }

    /// The webhooks in force.
    pub fn hooks(&self) -> Arc<Vec<Arc<Hook>>> {
        self.hooks.load_full()
    }

    /// Put `configs` in force (a reload): a webhook whose entry is
    /// unchanged keeps running as it is; a removed or changed one stops
    /// (its cursors stay in the engine, so an entry of the same name
    /// resumes where it stopped); a new or changed one starts.
    pub fn replace(&self, configs: &[WebhookConfig]) {
        let old = self.hooks.load_full();
        let next: Vec<Arc<Hook>> = configs
            .iter()
            .map(|c| match old.iter().find(|h| h.cfg == *c) {
                Some(h) => h.clone(),
                None => Arc::new(Hook::new(c.clone())),
            })
            .collect();
        for gone in old.iter().filter(|h| !next.iter().any(|n| Arc::ptr_eq(h, n))) {
            gone.stop.cancel();
        }
        self.hooks.store(Arc::new(next));
        self.changed.notify_one();
    }

    /// The server's outgoing HTTP client (webhooks and proxies).
    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub fn get(&self, name: &str) -> Option<Arc<Hook>> {
        self.hooks.load().iter().find(|h| h.cfg.name == name).cloned()
    }

    /// Before an append to `channel`: make sure every matching webhook has
    /// its cursor there (see the module docs). Volatile namespaces are not
    /// delivered.
    pub async fn ensure(
        &self,
        engine: &dyn Engine,
        ns: &NamespaceOptions,
        channel: &ChannelName,
    ) -> Result<(), EngineError> {
        // The namespace first: a volatile publish pays no load of the hooks.
        if !ns.is_durable() || self.hooks.load().is_empty() {
            return Ok(());
        }
        for hook in self.hooks().iter() {
            if !hook.cfg.matches(channel.as_str()) || hook.known.lock().expect("known lock").contains(channel)
            {
                continue;
            }
            // The position first: if another node created the cursor and
            // appended meanwhile, the cursor read below sees its cursor (it
            // was written before that append), so a head read after its
            // append can never become a cursor that skips it.
            let pos = engine.position(channel).await?;
            if engine.cursor(channel, &hook.sub).await?.is_none() {
                let start = match hook.cfg.new_channel_start {
                    StartAt::Oldest => pos.first.saturating_sub(1),
                    StartAt::Head => pos.head,
                };
                engine.ack(channel, &hook.sub, start).await.map_err(|e| match e {
                    herald_core::AckError::Engine(e) => e,
                    other => EngineError::Unavailable(other.to_string()),
                })?;
            }
            let mut known = hook.known.lock().expect("known lock");
            if known.len() >= KNOWN_CAP {
                known.clear();
            }
            known.insert(channel.clone());
        }
        Ok(())
    }

    /// After an append to `channel` on this node: wake its deliverers.
    pub fn appended(&self, channel: &ChannelName) {
        for hook in self.hooks.load().iter() {
            if hook.cfg.matches(channel.as_str()) {
                hook.retry(channel.clone());
            }
        }
    }
}

/// The deliverer: one loop per webhook until shutdown, each starting
/// channel workers; a reload's new webhooks get theirs as they come. Every
/// node runs it; leases make the work disjoint.
pub async fn run(state: Arc<AppState>) {
    let tasks = tokio_util::task::TaskTracker::new();
    let mut running: Vec<Arc<Hook>> = Vec::new();
    loop {
        running.retain(|h| !h.stop.is_cancelled());
        for hook in state.webhooks.hooks().iter() {
            if !running.iter().any(|r| Arc::ptr_eq(r, hook)) {
                running.push(hook.clone());
                tasks.spawn(hook_loop(state.clone(), hook.clone(), tasks.clone()));
            }
        }
        tokio::select! {
            () = state.shutdown.cancelled() => break,
            () = state.webhooks.changed.notified() => {}
        }
    }
    tasks.close();
    tasks.wait().await;
}

async fn hook_loop(state: Arc<AppState>, hook: Arc<Hook>, tasks: tokio_util::task::TaskTracker) {
    let Some(mut wake) = hook.wake_rx.lock().expect("wake lock").take() else { return };
    let mut tick = tokio::time::interval(hook.cfg.poll_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            biased;
            () = state.shutdown.cancelled() => return,
            () = hook.stop.cancelled() => return,
            Some(channel) = wake.recv() => start(&state, &hook, channel, &tasks),
            _ = tick.tick() => match scan(&state, &hook, &tasks).await {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!(webhook = %hook.cfg.name, "webhook scan recovered");
                }
                Ok(()) => {}
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(webhook = %hook.cfg.name, error = %e, "webhook scan failing; retrying every poll_interval");
                }
                Err(_) => {}
            },
        }
    }
}

/// Compare every cursor of the webhook with its channel's head and start a
/// worker where there is work. Also refreshes the lag gauge.
async fn scan(
    state: &Arc<AppState>,
    hook: &Arc<Hook>,
    tasks: &tokio_util::task::TaskTracker,
) -> Result<(), EngineError> {
    let cursors = state.engine.user_cursors(hook.sub.user(), SCAN_LIMIT).await?;
    let mut lag_total = 0u64;
    for c in cursors {
        if c.device.is_some() {
            continue;
        }
        let pos = state.engine.position(&c.channel).await?;
        let lag = pos.head.saturating_sub(c.cursor.seq);
        lag_total += lag;
        if lag > 0 {
            start(state, hook, c.channel, tasks);
        }
    }
    state.metrics.webhook_lag.get_or_create(&[("webhook", hook.cfg.name.clone())]).set(lag_total as i64);
    Ok(())
}

fn start(
    state: &Arc<AppState>,
    hook: &Arc<Hook>,
    channel: ChannelName,
    tasks: &tokio_util::task::TaskTracker,
) {
    let worker = {
        let mut workers = hook.workers.lock().expect("workers lock");
        if let Some(w) = workers.get(&channel) {
            w.more.store(true, Ordering::Release);
            return;
        }
        // Bounded: twice `max_parallel` channels have a worker (and its
        // engine reads) at once; the others wait for a later poll.
        if workers.len() >= hook.cfg.max_parallel * 2 {
            return;
        }
        let w = Arc::new(Worker { retry_now: Notify::new(), more: AtomicBool::new(false) });
        workers.insert(channel.clone(), w.clone());
        w
    };
    tasks.spawn(channel_worker(state.clone(), hook.clone(), channel, worker));
}

/// Outcome of one request.
enum Sent {
    Acked,
    Failed { class: &'static str, message: String },
}

async fn channel_worker(state: Arc<AppState>, hook: Arc<Hook>, channel: ChannelName, worker: Arc<Worker>) {
    let name = hook.cfg.name.clone();
    let key = hook.lease_key(&channel);
    let holder = state.webhooks.holder.clone();
    let ttl = hook.cfg.channel_lease_ttl;
    let mut lease: Option<(u64, Instant, bool)> = None; // (token, claimed at, engine lease)
    let mut backoff = FIRST_BACKOFF;
    // The highest seq already reported lost to retention (each lost seq is
    // counted once, not once per retry).
    let mut reported: Seq = 0;
    loop {
        if state.shutdown.is_cancelled() || hook.stop.is_cancelled() {
            break;
        }
        // Own the channel: claim, or renew after a third of the TTL.
        let due = lease.is_none_or(|(_, at, remote)| remote && at.elapsed() >= ttl / 3);
        if due {
            let claimed_at = Instant::now();
            match state.engine.claim(&key, &holder, ttl).await {
                Ok(Owned::Held(token)) => {
                    if let Some((old, _, _)) = lease {
                        if old != token {
                            tracing::info!(webhook = %name, channel = %channel, token, "webhook lease taken again after it lapsed");
                        }
                    }
                    lease = Some((token, claimed_at, true));
                }
                Ok(Owned::Local) => {
                    if lease.is_none() {
                        lease = Some((crate::integration::local_token(), claimed_at, false));
                    }
                }
                Ok(Owned::Busy) => {
                    if lease.is_some() {
                        tracing::info!(webhook = %name, channel = %channel, "webhook lease lost to another node");
                    }
                    lease = None;
                    break;
                }
                Err(e) => {
                    hook.note_error(&channel, "engine", e.to_string());
                    if !pause(&state, &worker, &mut backoff, hook.cfg.max_backoff.min(ttl / 3)).await {
                        break;
                    }
                    continue;
                }
            }
        }
        let Some((token, _, _)) = lease else { break };
        match step(&state, &hook, &channel, token, &mut reported).await {
            Ok(None) => {
                // Caught up: leave unless work arrived meanwhile.
                let leave = {
                    let mut workers = hook.workers.lock().expect("workers lock");
                    let leave = !worker.more.swap(false, Ordering::AcqRel);
                    if leave {
                        workers.remove(&channel);
                    }
                    leave
                };
                if !leave {
                    continue;
                }
                release(&state, &key, &holder, lease).await;
                return;
            }
            Ok(Some(Sent::Acked)) => {
                backoff = FIRST_BACKOFF;
                hook.errors.lock().expect("errors lock").remove(&channel);
            }
            Ok(Some(Sent::Failed { class, message })) => {
                state
                    .metrics
                    .webhook_failures
                    .get_or_create(&[("webhook", name.clone()), ("class", class.to_owned())])
                    .inc();
                tracing::debug!(webhook = %name, channel = %channel, class, error = %message, "webhook request failed; backing off");
                hook.note_error(&channel, class, message);
                // Sleep in slices so the lease is renewed during a long backoff.
                if !pause(&state, &worker, &mut backoff, hook.cfg.max_backoff).await {
                    break;
                }
            }
            Err(e) => {
                hook.note_error(&channel, "engine", e.to_string());
                if !pause(&state, &worker, &mut backoff, hook.cfg.max_backoff).await {
                    break;
                }
            }
        }
    }
    hook.workers.lock().expect("workers lock").remove(&channel);
    release(&state, &key, &holder, lease).await;
}

async fn release(state: &AppState, key: &str, holder: &str, lease: Option<(u64, Instant, bool)>) {
    if let Some((_, _, true)) = lease {
        if let Err(e) = state.engine.release(key, holder).await {
            tracing::debug!(error = %e, "webhook lease release failed; it expires");
        }
    }
}

/// Wait the backoff (with jitter, at most a third of the lease so it is
/// renewed in time), or less on `retry`; doubles it for next time. `false`
/// on shutdown.
async fn pause(state: &AppState, worker: &Worker, backoff: &mut Duration, cap: Duration) -> bool {
    let jittered = backoff.mul_f64(0.5 + fastrand::f64() * 0.5);
    *backoff = (*backoff * 2).min(cap.max(FIRST_BACKOFF));
    tokio::select! {
        () = state.shutdown.cancelled() => false,
        () = worker.retry_now.notified() => true,
        () = tokio::time::sleep(jittered) => true,
    }
}

/// Send the next batch of `channel` after its cursor. `None`: nothing to
/// send.
async fn step(
    state: &AppState,
    hook: &Hook,
    channel: &ChannelName,
    token: u64,
    reported: &mut Seq,
) -> Result<Option<Sent>, EngineError> {
    let cursor = state.engine.cursor(channel, &hook.sub).await?.map_or(0, |c| c.seq);
    let page = state.engine.read(channel, cursor, hook.cfg.max_messages_per_request).await?;
    let Some(first) = page.messages.first() else { return Ok(None) };
    let first_seq = first.seq.unwrap_or(0);
    let lost_from = (cursor + 1).max(*reported + 1);
    if first_seq > lost_from {
        *reported = first_seq - 1;
        overtaken(state, hook, channel, lost_from, first_seq);
    }
    let last: Seq = page.messages.last().and_then(|m| m.seq).unwrap_or(first_seq);
    let body = sign::body(&hook.cfg.name, channel.as_str(), page.position.epoch.as_str(), &page.messages);
    let signature = sign::signature(hook.cfg.secret.as_bytes(), now_ms() / 1000, &body);
    let _permit = hook.permits.acquire().await.expect("never closed");
    let started = Instant::now();
    // A trace of its own (a webhook request carries many publishes), whose
    // `traceparent` the backend continues.
    let span = tracing::trace_span!(
        target: crate::trace::TARGET,
        "herald.webhook",
        webhook = %hook.cfg.name,
        channel = %channel,
        messages = page.messages.len(),
    );
    let req = state
        .webhooks
        .http
        .post(&hook.cfg.url)
        .timeout(hook.cfg.timeout)
        .header("content-type", "application/json")
        .header("herald-webhook-id", &hook.cfg.name)
        .header("herald-signature", signature)
        .header("herald-fencing-token", token.to_string());
    let req = match crate::trace::traceparent(&span) {
        Some(tp) => req.header("traceparent", tp),
        None => req,
    };
    let result = req.body(body).send().instrument(span).await;
    state.metrics.webhook_request_duration.observe(started.elapsed().as_secs_f64());
    let sent = match result {
        Ok(r) if r.status().is_success() => Sent::Acked,
        Ok(r) => Sent::Failed { class: "status", message: format!("HTTP {}", r.status().as_u16()) },
        Err(e) if e.is_timeout() => Sent::Failed { class: "timeout", message: "request timed out".into() },
        Err(e) if e.is_connect() => {
            Sent::Failed { class: "connect", message: format!("connect failed: {e}") }
        }
        Err(e) => Sent::Failed { class: "other", message: e.to_string() },
    };
    if let Sent::Acked = sent {
        match state.engine.ack(channel, &hook.sub, last).await {
            Ok(_) => {}
            Err(herald_core::AckError::Engine(e)) => return Err(e),
            Err(e) => return Err(EngineError::Unavailable(e.to_string())),
        }
        let n = page.messages.len() as u64;
        state.metrics.webhook_delivered.get_or_create(&[("webhook", hook.cfg.name.clone())]).inc_by(n);
    }
    Ok(Some(sent))
}

/// Retention removed `from .. first` before they were delivered.
fn overtaken(state: &AppState, hook: &Hook, channel: &ChannelName, from: Seq, first: Seq) {
    let lost = first - from;
    state.metrics.webhook_overtaken.get_or_create(&[("webhook", hook.cfg.name.clone())]).inc_by(lost);
    tracing::warn!(
        webhook = %hook.cfg.name, channel = %channel, from, to = first - 1,
        "retention removed messages before the webhook delivered them"
    );
}

pub(crate) use crate::rooms::now_ms;
