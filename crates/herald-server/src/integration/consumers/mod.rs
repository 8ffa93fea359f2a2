//! Outbox consumers: rows an application committed to its own database
//! (PostgreSQL) or stream (Redis) become messages, each exactly once and
//! per channel in the order of the source's ids.
//!
//! # Invariants
//!
//! - **One path.** A row is published through the path of the HTTP API: a
//!   row of one channel through [`AppState::publish_many`], a row of
//!   several through [`AppState::publish_to_channels`] after the checks of
//!   a message to several channels. Namespace rules, the rules of `data`,
//!   limits, rooms and webhooks see it like any publish.
//! - **Exactly once.** Every row's publish carries an idempotency key in
//!   the scope `consumer:<name>`: the row's own `idempotency_key`, or
//!   `row:<id>`, one key for all the row's channels. A row is removed (or
//!   marked, or acknowledged) only after its appends are durable, so a
//!   crash between the two publishes it again and the engine answers from
//!   its receipts: nothing is lost or doubled on any channel while
//!   receipts last (`idempotency_ttl`).
//! - **Order.** A partition (a hash of the row's first channel, so a
//!   channel's single-channel rows are in one partition) is read in id
//!   order by one owner at a time, and a row is attempted only after every
//!   earlier row of the batch sharing any of its channels was appended or
//!   parked ([`publish_rows`]): a transient failure stops the batch, which
//!   is read again from the source.
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

use herald_proto::{ErrorCode, Meta};
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
    /// Its channels ([`channels_of`]): one, or several published as one
    /// message to several channels.
    pub channels: Vec<String>,
    /// JSON text.
    pub data: String,
    /// JSON text of an object of strings, if any.
    pub meta: Option<String>,
    pub idempotency_key: Option<String>,
    /// Refused as read (no channel, a field this source does not support):
    /// parked with this code and detail, never published.
    pub refused: Option<(ErrorCode, String)>,
}

impl Row {
    /// A row read from the source: its `channel` and `channels` fields
    /// ([`channels_of`]) and the rest as they are.
    pub fn new(
        id: String,
        channel: Option<String>,
        channels: Option<Vec<Option<String>>>,
        data: String,
        meta: Option<String>,
        idempotency_key: Option<String>,
    ) -> Self {
        let (channels, refused) = match channels_of(channel, channels) {
            Ok(c) => (c, None),
            Err(detail) => (Vec::new(), Some((ErrorCode::BadChannel, detail))),
        };
        Row { id, channels, data, meta, idempotency_key, refused }
    }
}

/// A row's channels: `channel` (if any) followed by the entries of
/// `channels` (if any), each once, in that order. `Err` (the detail of a
/// `bad_channel`) when that leaves none or `channels` holds a null.
pub fn channels_of(
    channel: Option<String>,
    channels: Option<Vec<Option<String>>>,
) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for c in channel.into_iter().map(Some).chain(channels.into_iter().flatten()) {
        let Some(c) = c else {
            return Err("`channels` holds a null entry".to_owned());
        };
        if !out.contains(&c) {
            out.push(c);
        }
    }
    if out.is_empty() {
        return Err("the row names no channel: `channel` and `channels` are both null or empty".to_owned());
    }
    Ok(out)
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
    /// Rows (entries) due and waiting in the source at the last look, if
    /// known.
    pub lag: Option<u64>,
    /// Rows scheduled for later (`deliver_at` in the future) at the last
    /// look; `None` without a `deliver_at` column.
    pub scheduled_rows: Option<u64>,
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

/// A row's `data`, `meta` and idempotency key (its own or `row:<id>`),
/// checked as the API checks a message's; or why it can never be one.
fn parts(row: &Row) -> Result<(Box<RawValue>, Option<Meta>, String), ApiError> {
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
    Ok((data, meta, key))
}

/// A row of one channel as a publish (the single publish of the API, under
/// the row's key), or why it can never be one.
fn to_publish(state: &AppState, consumer: &str, row: &Row) -> Result<Publish, ApiError> {
    let (channel, _) = state.resolve_channel(&row.channels[0])?;
    let (data, meta, key) = parts(row)?;
    let fp = fingerprint(std::slice::from_ref(&channel), &data, meta.as_ref());
    let dedup = Some((ScopedKey::new(&scope(consumer), &key).anchor(), fp));
    Ok(Publish { channel, data, meta, dedup })
}

/// Publish a row of several channels as the API publishes one message to
/// several channels under a key (`POST /api/v1/publish`): every channel and
/// `data` checked before anything is appended, then
/// [`AppState::publish_to_channels`]. One outcome for the whole row: a
/// transient failure of any channel retries the row (the channels already
/// appended answer from their receipts), otherwise a refusal of any
/// channel parks it.
async fn publish_several(state: &AppState, consumer: &str, row: &Row) -> Result<Outcome, ApiError> {
    let refused = |e: ApiError| {
        if refuses_the_row(&e) {
            Ok(Outcome::Park { code: e.code, detail: e.detail })
        } else {
            Err(e)
        }
    };
    let checked = state.batch_targets(&row.channels).and_then(|targets| {
        let (data, meta, key) = parts(row)?;
        state.check_publish_data(&data)?;
        Ok((targets, data, meta, key))
    });
    let (targets, data, meta, key) = match checked {
        Ok(c) => c,
        Err(e) => return refused(e),
    };
    let outcomes = match state.publish_to_channels(&scope(consumer), Some(&key), &targets, &data, &meta).await
    {
        Ok(o) => o,
        Err(e) => return refused(e),
    };
    let mut duplicate = true;
    let mut refusal = None;
    for ((channel, _), outcome) in targets.iter().zip(outcomes) {
        match outcome {
            Ok(receipt) => duplicate &= receipt.duplicate,
            Err(e) if refuses_the_row(&e) => {
                refusal.get_or_insert(ApiError::new(e.code, format!("channel `{channel}`: {}", e.detail)));
            }
            Err(e) => return Err(e),
        }
    }
    match refusal {
        Some(e) => refused(e),
        None => Ok(Outcome::Published { duplicate }),
    }
}

/// The idempotency scope of a consumer's publishes.
pub fn scope(consumer: &str) -> String {
    format!("consumer:{consumer}")
}

/// Publish `rows` (in source id order) through the API's path. Returns one
/// outcome per row, `None` for rows not attempted, and the transient error
/// that stopped the batch, if any.
///
/// Rows go to the engine in waves: a row goes in the wave after the last
/// wave holding an earlier row that shares any of its channels, so a row is
/// appended only after every earlier row of each of its channels was
/// appended or parked. Within a wave, the rows of one channel go to the
/// engine together as one submission; each row of several channels keeps
/// the key protocol of a message to several channels (its first channel
/// decides before the others are appended). A transient failure ends the batch after its wave:
/// no later row of any channel is attempted, and the caller reads the
/// unfinished rows again (their repeats are receipts). A row refused as read
/// is parked without a wave.
pub(crate) async fn publish_rows(
    state: &AppState,
    consumer: &Consumer,
    rows: &[Row],
) -> (Vec<Option<Outcome>>, Option<ApiError>) {
    let name = &consumer.cfg.name;
    let mut outcomes: Vec<Option<Outcome>> = vec![None; rows.len()];
    for (i, row) in rows.iter().enumerate() {
        if let Some((code, detail)) = &row.refused {
            outcomes[i] = Some(Outcome::Park { code: *code, detail: detail.clone() });
        }
    }
    for wave in waves(rows) {
        let (single, several): (Vec<usize>, Vec<usize>) =
            wave.iter().partition(|&&i| rows[i].channels.len() == 1);
        let items = single.iter().map(|&i| to_publish(state, name, &rows[i])).collect();
        let (results, several_results) = futures_util::future::join(
            state.publish_many(items, true),
            futures_util::future::join_all(several.iter().map(|&i| publish_several(state, name, &rows[i]))),
        )
        .await;
        let mut transient = None;
        for (&i, result) in single.iter().zip(results) {
            outcomes[i] = match result {
                Ok(receipt) => Some(Outcome::Published { duplicate: receipt.duplicate }),
                Err(e) if refuses_the_row(&e) => Some(Outcome::Park { code: e.code, detail: e.detail }),
                Err(e) => {
                    transient.get_or_insert(e);
                    None
                }
            };
        }
        for (&i, result) in several.iter().zip(several_results) {
            outcomes[i] = match result {
                Ok(outcome) => Some(outcome),
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

/// The waves of [`publish_rows`]: row indexes, each row in the wave after
/// the last one holding an earlier row that shares any of its channels.
/// Rows refused as read are in none.
fn waves(rows: &[Row]) -> Vec<Vec<usize>> {
    let mut waves: Vec<Vec<usize>> = Vec::new();
    // Per channel: the wave after its last row's.
    let mut next: HashMap<&str, usize> = HashMap::new();
    for (i, row) in rows.iter().enumerate() {
        if row.refused.is_some() {
            continue;
        }
        let n = row.channels.iter().map(|c| next.get(c.as_str()).copied().unwrap_or(0)).max().unwrap_or(0);
        if waves.len() <= n {
            waves.push(Vec::new());
        }
        waves[n].push(i);
        for c in &row.channels {
            next.insert(c.as_str(), n + 1);
        }
    }
    waves
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

/// A partition's ownership as this node holds it: the engine's lease on
/// `consumer:<name>:<partition>` (renewed every third of
/// `partition_lease_ttl`), or a one-node engine's local token, and whether
/// its token is raised in the source (every removal is fenced by it).
pub(crate) struct PartitionLease {
    partition: usize,
    key: String,
    holder: String,
    ttl: Duration,
    held: Option<Held>,
}

/// What this node holds now.
#[derive(Clone, Copy)]
pub(crate) struct Held {
    pub token: u64,
    /// When the engine granted (or renewed) it.
    pub claimed_at: std::time::Instant,
    /// An engine lease that lapses unless renewed (`false`: a local token).
    pub remote: bool,
    /// The token is raised in the source.
    pub fenced: bool,
}

/// The outcome of [`PartitionLease::claim`].
pub(crate) enum Claim {
    /// This node holds the partition (its token may still need raising).
    Held(Held),
    /// Another node holds it.
    Busy,
    /// The engine did not answer; retry after a backoff.
    Failed,
}

impl PartitionLease {
    pub fn new(state: &AppState, cfg: &ConsumerConfig, partition: usize) -> Self {
        Self {
            partition,
            key: format!("consumer:{}:{partition}", cfg.name),
            holder: state.consumers.holder.clone(),
            ttl: cfg.partition_lease_ttl,
            held: None,
        }
    }

    /// Claim the partition, or renew the lease when a third of its TTL has
    /// passed; the status follows (`expires`, `owned`, the engine's error).
    pub async fn claim(&mut self, state: &AppState, consumer: &Consumer) -> Claim {
        let p = self.partition;
        let due = self.held.is_none_or(|h| h.remote && h.claimed_at.elapsed() >= self.ttl / 3);
        if due {
            let claimed_at = std::time::Instant::now();
            match state.engine.claim(&self.key, &self.holder, self.ttl).await {
                Ok(herald_core::Owned::Held(token)) => {
                    let fenced = self.held.is_some_and(|h| h.token == token && h.fenced);
                    self.held = Some(Held { token, claimed_at, remote: true, fenced });
                    if fenced {
                        consumer.update(p, |s| s.expires = Some(claimed_at + self.ttl));
                    }
                }
                Ok(herald_core::Owned::Local) => {
                    if self.held.is_none() {
                        let token = crate::integration::local_token();
                        self.held = Some(Held { token, claimed_at, remote: false, fenced: false });
                    }
                }
                Ok(herald_core::Owned::Busy) => {
                    if self.held.take().is_some() {
                        tracing::info!(consumer = %consumer.cfg.name, partition = p, "consumer partition taken by another node");
                    }
                    consumer.update(p, |s| s.owned = false);
                    return Claim::Busy;
                }
                Err(e) => {
                    consumer.note_error(p, format!("engine: {e}"));
                    return Claim::Failed;
                }
            }
        }
        match self.held {
            Some(h) => Claim::Held(h),
            None => Claim::Busy,
        }
    }

    /// The token is raised in the source: the partition is this node's.
    pub fn fenced(&mut self, consumer: &Consumer) {
        let p = self.partition;
        let Some(h) = self.held.as_mut() else { return };
        h.fenced = true;
        let (token, expires) = (h.token, h.remote.then(|| h.claimed_at + self.ttl));
        consumer.update(p, |s| {
            s.owned = true;
            s.token = token;
            s.expires = expires;
        });
    }

    /// The source holds a greater token: another node owns the partition.
    pub fn lost(&mut self, consumer: &Consumer) {
        self.held = None;
        consumer.update(self.partition, |s| s.owned = false);
    }

    /// How long until the lease must be renewed (`None`: a local token,
    /// never).
    pub fn renew_in(&self) -> Option<Duration> {
        self.held.filter(|h| h.remote).map(|h| (self.ttl / 3).saturating_sub(h.claimed_at.elapsed()))
    }

    /// The longest the engine may be retried before the lease is at risk.
    pub fn retry_cap(&self, max_backoff: Duration) -> Duration {
        max_backoff.min(self.ttl / 3)
    }

    /// At shutdown: give an engine lease back (it would lapse anyway).
    pub async fn release(self, state: &AppState, consumer: &Consumer) {
        if self.held.is_some_and(|h| h.remote) {
            if let Err(e) = state.engine.release(&self.key, &self.holder).await {
                tracing::debug!(error = %e, "consumer lease release failed; it expires");
            }
        }
        consumer.update(self.partition, |s| s.owned = false);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: u32, channel: Option<&str>, channels: Option<&[&str]>) -> Row {
        let channels = channels.map(|c| c.iter().map(|c| Some(c.to_string())).collect());
        Row::new(id.to_string(), channel.map(str::to_owned), channels, "1".into(), None, None)
    }

    #[test]
    fn a_rows_channels_are_its_channel_then_its_channels_each_once() {
        let some = |c: &[&str]| Some(c.iter().map(|c| Some(c.to_string())).collect::<Vec<_>>());
        let of = |c: Option<&str>, cs| channels_of(c.map(str::to_owned), cs);
        assert_eq!(of(Some("a:1"), None).unwrap(), ["a:1"]);
        assert_eq!(of(Some("a:1"), some(&["a:2", "a:1", "a:3", "a:2"])).unwrap(), ["a:1", "a:2", "a:3"]);
        assert_eq!(of(None, some(&["a:2"])).unwrap(), ["a:2"]);
        assert!(of(None, None).unwrap_err().contains("no channel"));
        assert!(of(None, some(&[])).unwrap_err().contains("no channel"));
        assert!(of(Some("a:1"), Some(vec![None])).unwrap_err().contains("null"));
        let r = row(7, None, Some(&[]));
        assert_eq!(r.refused.map(|(code, _)| code), Some(ErrorCode::BadChannel));
    }

    #[test]
    fn a_row_waits_for_the_earlier_rows_of_every_one_of_its_channels() {
        let rows = [
            row(1, Some("a:1"), None),           // wave 0
            row(2, Some("a:1"), None),           // wave 1
            row(3, Some("b:1"), None),           // wave 0
            row(4, Some("b:1"), Some(&["a:1"])), // after 2 (a:1) and 3 (b:1): wave 2
            row(5, Some("c:1"), None),           // wave 0
            row(6, None, None),                  // refused: no wave
            row(7, Some("c:1"), Some(&["d:1"])), // after 5: wave 1
            row(8, Some("d:1"), None),           // after 7: wave 2
            row(9, Some("b:1"), None),           // after 4: wave 3
        ];
        assert_eq!(waves(&rows), vec![vec![0, 2, 4], vec![1, 6], vec![3, 7], vec![8]]);
    }
}
