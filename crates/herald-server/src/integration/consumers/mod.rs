//! Outbox consumers: rows an application committed to its own database
//! (PostgreSQL) or stream (Redis) become messages, each exactly once and
//! per channel in the order of the source's ids.
//!
//! # Invariants
//!
//! - **One path.** A row is published through [`AppState::publish_many`],
//!   the path of the HTTP API: namespace rules, the rules of `data`,
//!   limits, rooms and webhooks see it like any publish.
//! - **Exactly once.** Every row's publish carries an idempotency key in
//!   the scope `consumer:<name>`: the row's own `idempotency_key`, or
//!   `row:<id>`. A row is removed (or marked, or acknowledged) only after
//!   its append is durable, so a crash between the two publishes it again
//!   and the engine answers from its receipt: nothing is lost or doubled
//!   while receipts last (`idempotency_ttl`).
//! - **Order.** A partition (a hash of the channel, so a channel is in one
//!   partition) is read in id order by one owner at a time, and a channel's
//!   row is attempted only after every earlier row of that channel in the
//!   batch was appended or parked ([`publish_rows`]): a transient failure
//!   stops the batch, which is read again from the source.
//! - **Fenced.** Partitions are owned through [`Ownership`](herald_core::Ownership)
//!   leases; every removal in the source is conditioned on the owner's
//!   fencing token there (`postgres.rs`), so a paused node's late batch
//!   removes nothing it no longer owns, and its appends are receipts.
//! - **Bad rows do not block.** A row refused for what it is (a bad
//!   channel, `data` or `meta`, a refused namespace, a key reused for other
//!   content) is parked aside with its error code, counted and logged, and
//!   the partition goes on.

pub mod config;
pub(crate) mod postgres;
pub(crate) mod redis_stream;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_proto::{ChannelName, ErrorCode, Meta};
use serde_json::value::RawValue;
use tokio::sync::Notify;

pub use config::{AfterPublish, ConsumerConfig, ConsumerKind};

use crate::error::ApiError;
use crate::publish::{fingerprint, validate_idempotency_key, Publish, ScopedKey};
use crate::state::AppState;

/// The first retry delay; doubled on each failure up to `max_backoff`.
pub(crate) const BACKOFF_START: Duration = Duration::from_millis(100);
/// Longest error text kept for the status API.
const ERROR_TEXT: usize = 300;

/// One row (or stream entry) as read from the source.
#[derive(Debug, Clone)]
pub struct Row {
    /// The source's id: a row id, or a stream entry id.
    pub id: String,
    pub channel: String,
    /// JSON text.
    pub data: String,
    /// JSON text of an object of strings, if any.
    pub meta: Option<String>,
    pub idempotency_key: Option<String>,
}

/// What became of one row.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Durable in the log (`duplicate`: answered from an earlier append's
    /// receipt).
    Published { duplicate: bool },
    /// Refused for what it is: move it aside.
    Park { code: ErrorCode, detail: String },
}

/// A failure of the consumer itself (source or engine), for the status API.
#[derive(Debug, Clone)]
pub struct LastError {
    pub at_ms: u64,
    pub message: String,
}

/// One partition as this node sees it.
#[derive(Debug, Clone, Default)]
pub struct PartitionState {
    /// This node took the partition and has not seen it lost.
    pub owned: bool,
    /// When its engine lease lapses unless renewed (`None`: a one-node
    /// engine, no lease). A node woken from a pause past this no longer
    /// reports the partition as its own, before it even noticed.
    pub expires: Option<std::time::Instant>,
    /// Its fencing token while owned.
    pub token: u64,
    /// The greatest id this node published and removed (or marked).
    pub last_id: Option<String>,
    /// Rows (entries) waiting in the source at the last look, if known.
    pub lag: Option<u64>,
    /// Rows in the dead-letter table for this consumer at the last look.
    pub parked_rows: Option<u64>,
    pub last_error: Option<LastError>,
}

impl PartitionState {
    /// Owned now: taken, not seen lost, and its lease not lapsed.
    pub fn is_owned(&self) -> bool {
        self.owned && self.expires.is_none_or(|e| e > std::time::Instant::now())
    }
}

/// One configured consumer and what its partitions report.
pub struct Consumer {
    pub cfg: ConsumerConfig,
    pub partitions: Vec<Mutex<PartitionState>>,
    /// Woken by `POST .../retry`: every partition reads again now.
    pub(crate) wake: Notify,
    published: AtomicU64,
    parked: AtomicU64,
}

impl Consumer {
    fn new(cfg: ConsumerConfig) -> Self {
        let n = cfg.partitions.max(1) as usize;
        Consumer {
            partitions: (0..n).map(|_| Mutex::default()).collect(),
            cfg,
            wake: Notify::new(),
            published: AtomicU64::new(0),
            parked: AtomicU64::new(0),
        }
    }

    pub fn partition(&self, p: usize) -> PartitionState {
        self.partitions[p].lock().expect("partition lock").clone()
    }

    pub(crate) fn update(&self, p: usize, f: impl FnOnce(&mut PartitionState)) {
        f(&mut self.partitions[p].lock().expect("partition lock"));
    }

    pub(crate) fn note_error(&self, p: usize, message: impl std::fmt::Display) {
        let message: String = message.to_string().chars().take(ERROR_TEXT).collect();
        self.update(p, |s| s.last_error = Some(LastError { at_ms: now_ms(), message }));
    }

    /// Rows published by this node since it started.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }

    /// Rows parked by this node since it started.
    pub fn parked(&self) -> u64 {
        self.parked.load(Ordering::Relaxed)
    }
}

/// Every configured consumer of this server.
pub struct Consumers {
    pub list: Vec<Arc<Consumer>>,
    /// This process's holder id for partition leases.
    holder: String,
}

impl Consumers {
    pub fn new(configs: &[ConsumerConfig]) -> Self {
        Consumers {
            list: configs.iter().cloned().map(|c| Arc::new(Consumer::new(c))).collect(),
            holder: uuid::Uuid::new_v4().simple().to_string(),
        }
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Consumer>> {
        self.list.iter().find(|c| c.cfg.name == name)
    }
}

/// Run every consumer's partitions until shutdown. Every node runs them;
/// leases make the work disjoint.
pub async fn run(state: Arc<AppState>) {
    let tasks = tokio_util::task::TaskTracker::new();
    for consumer in &state.consumers.list {
        for p in 0..consumer.partitions.len() {
            match consumer.cfg.kind {
                Some(ConsumerKind::Postgres) => {
                    tasks.spawn(postgres::run_partition(state.clone(), consumer.clone(), p));
                }
                Some(ConsumerKind::RedisStream) => {
                    tasks.spawn(redis_stream::run(state.clone(), consumer.clone()));
                }
                None => {}
            }
        }
    }
    tasks.close();
    tasks.wait().await;
}

/// Whether an error refuses the row itself (park it) rather than the
/// attempt (retry the batch later).
fn refuses_the_row(e: &ApiError) -> bool {
    let status = e.code.http_status();
    (400..500).contains(&status) && e.code != ErrorCode::IdempotencyKeyInFlight
}

/// A row as a publish, or why it can never be one.
fn to_publish(state: &AppState, consumer: &str, row: &Row) -> Result<Publish, ApiError> {
    let channel =
        ChannelName::new(&row.channel).map_err(|e| ApiError::new(ErrorCode::BadChannel, e.to_string()))?;
    state.config().namespaces.resolve(&channel)?;
    let data = RawValue::from_string(row.data.clone())
        .map_err(|e| ApiError::new(ErrorCode::BadData, format!("`data` is not JSON: {e}")))?;
    let meta: Option<Meta> = match row.meta.as_deref() {
        None | Some("null") => None,
        Some(text) => {
            let meta: Meta = serde_json::from_str(text).map_err(|_| {
                ApiError::new(ErrorCode::BadRequest, "`meta` must be a JSON object of strings")
            })?;
            herald_proto::validate_meta(&meta).map_err(|e| ApiError::new(ErrorCode::BadRequest, e))?;
            Some(meta)
        }
    };
    let key = match &row.idempotency_key {
        Some(k) => {
            validate_idempotency_key(k)?;
            k.clone()
        }
        None => format!("row:{}", row.id),
    };
    let fp = fingerprint(std::slice::from_ref(&channel), &data, meta.as_ref());
    let dedup = Some((ScopedKey::new(&scope(consumer), &key).anchor(), fp));
    Ok(Publish { channel, data, meta, dedup })
}

/// The idempotency scope of a consumer's publishes.
pub fn scope(consumer: &str) -> String {
    format!("consumer:{consumer}")
}

/// Publish `rows` (in source id order) through the API's path. Returns one
/// outcome per row, `None` for rows not attempted, and the transient error
/// that stopped the batch, if any.
///
/// Rows go to the engine in waves: wave `n` holds the `n`-th row of each
/// channel, so a row is appended only after every earlier row of its
/// channel was appended or parked. A transient failure ends the batch after
/// its wave: no later row of any channel is attempted, and the caller reads
/// the unfinished rows again (their repeats are receipts).
pub(crate) async fn publish_rows(
    state: &AppState,
    consumer: &Consumer,
    rows: &[Row],
) -> (Vec<Option<Outcome>>, Option<ApiError>) {
    let name = &consumer.cfg.name;
    let mut outcomes: Vec<Option<Outcome>> = vec![None; rows.len()];
    let mut waves: Vec<Vec<usize>> = Vec::new();
    let mut per_channel: HashMap<&str, usize> = HashMap::new();
    for (i, row) in rows.iter().enumerate() {
        let n = per_channel.entry(row.channel.as_str()).or_default();
        if waves.len() <= *n {
            waves.push(Vec::new());
        }
        waves[*n].push(i);
        *n += 1;
    }
    for wave in waves {
        let mut items = Vec::with_capacity(wave.len());
        for &i in &wave {
            items.push(to_publish(state, name, &rows[i]));
        }
        let results = state.publish_many(items, true).await;
        let mut transient = None;
        for (&i, result) in wave.iter().zip(results) {
            outcomes[i] = match result {
                Ok(receipt) => Some(Outcome::Published { duplicate: receipt.duplicate }),
                Err(e) if refuses_the_row(&e) => Some(Outcome::Park { code: e.code, detail: e.detail }),
                Err(e) => {
                    transient.get_or_insert(e);
                    None
                }
            };
        }
        if transient.is_some() {
            return (outcomes, transient);
        }
    }
    (outcomes, None)
}

/// Count the outcomes of a finished batch in the metrics and log parked
/// rows (without their data).
pub(crate) fn account(
    state: &AppState,
    consumer: &Consumer,
    partition: usize,
    rows: &[Row],
    outcomes: &[Option<Outcome>],
) {
    let name = consumer.cfg.name.clone();
    let (mut published, mut duplicates, mut parked) = (0u64, 0u64, 0u64);
    for (row, outcome) in rows.iter().zip(outcomes) {
        match outcome {
            Some(Outcome::Published { duplicate: false }) => published += 1,
            Some(Outcome::Published { duplicate: true }) => duplicates += 1,
            Some(Outcome::Park { code, detail }) => {
                parked += 1;
                tracing::warn!(consumer = %name, partition, id = %row.id, code = code.as_str(), error = %detail, "outbox row parked");
            }
            None => {}
        }
    }
    let label = [("consumer", name)];
    state.metrics.consumer_published.get_or_create(&label).inc_by(published);
    state.metrics.consumer_duplicates.get_or_create(&label).inc_by(duplicates);
    state.metrics.consumer_parked.get_or_create(&label).inc_by(parked);
    consumer.published.fetch_add(published + duplicates, Ordering::Relaxed);
    consumer.parked.fetch_add(parked, Ordering::Relaxed);
}

/// Wait `backoff` (jittered) or until shutdown (`false`); doubles it.
pub(crate) async fn pause(state: &AppState, backoff: &mut Duration, cap: Duration) -> bool {
    let jittered = backoff.mul_f64(0.5 + fastrand::f64() * 0.5);
    *backoff = (*backoff * 2).min(cap.max(BACKOFF_START));
    tokio::select! {
        () = state.shutdown.cancelled() => false,
        () = tokio::time::sleep(jittered) => true,
    }
}

pub(crate) use crate::rooms::now_ms;
