//! The PostgreSQL outbox consumer: one task per partition, each with its
//! own connection (its `LISTEN` too), reading committed rows in id order.
//!
//! # Invariants
//!
//! - **Ids are read only behind a barrier.** A `bigserial` id is taken
//!   when a transaction inserts, but the row becomes visible when that
//!   transaction commits, so ids commit out of order: reading "rows after
//!   the last id" can pass over a smaller id committed a moment later. A
//!   step therefore first reads `H`, the last value the id sequence handed
//!   out, then the transactions holding a `RowExclusiveLock` on the table or
//!   its sequence (every transaction that took an id or inserted holds one
//!   until it ends; the consumer's own partition connections, named
//!   `herald consumer <name>` whatever the DSN says, only remove rows and
//!   are left out), waits until each of those has ended, and only then
//!   reads rows with `id <= H`. Every id up to `H` was handed out before the
//!   lock list was read, so its transaction was in that list or had ended:
//!   once the list is gone, each row up to `H` is committed (and visible)
//!   or will never exist. This needs a sequence with `CACHE 1` (the
//!   default); setup refuses a cached one.
//! - **Removal is fenced in PostgreSQL.** `herald_consumer_state` keeps,
//!   per (consumer, partition), the greatest fencing token any owner
//!   presented. An owner raises it when it takes the partition and removes
//!   or marks rows only in a transaction that holds that row `FOR UPDATE`
//!   and still finds its own token: a paused node whose partition was taken
//!   over removes nothing.
//! - **A frozen owner cannot hold the others up for long.** Each
//!   connection sets `idle_in_transaction_session_timeout` to half a lease
//!   and `lock_timeout` to a third: a node paused inside its removal
//!   transaction loses it (and its locks) to PostgreSQL, and wakes to a
//!   closed connection and a greater fence.
//! - **Scheduled rows are read when due.** With a `deliver_at` column a
//!   read takes only rows whose `deliver_at` is null or past by
//!   PostgreSQL's clock (`now()`), still in id order and still behind the
//!   barrier: a row not yet due is final like any other, only skipped, so
//!   it holds no later row back and stays in the outbox (a crash loses
//!   nothing) until a read finds it due. After a short batch the partition
//!   sleeps until the earliest `deliver_at` of its scheduled rows (or a
//!   notification, or `poll_interval`), so a row is read just after it is
//!   due.
//! - **A row's partition is its first channel's.** With a `channels`
//!   column the partition hashes `coalesce(channel, channels[1], '')`: a
//!   row that names no channel still belongs to a partition, which reads
//!   and parks it.
//! - Rows are removed (or marked) only after [`publish_rows`] returned
//!   their durable outcomes; a parked row is copied to the dead-letter table
//!   and removed in the same transaction.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, Client, NoTls};

use super::{
    account, pause, publish_rows, AfterPublish, Claim, Consumer, ConsumerConfig, Outcome, PartitionLease,
    Row, BACKOFF_START,
};
use crate::error::ApiError;
use crate::state::AppState;

mod sql;

use sql::{columns_of, ddl, Columns, Sql};

/// The longest poll of `pg_locks` while waiting for writers.
const BARRIER_POLL_MAX: Duration = Duration::from_millis(20);
/// How long after a scheduled row's `deliver_at` its partition reads again.
const SCHEDULE_MARGIN: Duration = Duration::from_millis(2);

/// Why a step or the setup failed.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("postgres: {}", pg_text(.0))]
    Pg(#[from] tokio_postgres::Error),
    #[error("{0}")]
    Setup(String),
    #[error("publish: {}", .0.detail)]
    Publish(ApiError),
    /// Another owner presented a greater fencing token.
    #[error("the partition was taken over by another owner")]
    Lost,
}

/// A PostgreSQL error as one line: the server's code and message when it
/// sent one (tokio-postgres shows only "db error" then). The connection
/// string is never part of it.
fn pg_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => match std::error::Error::source(e) {
            // "error connecting to server: Connection refused (os error 111)"
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

/// One partition's connection and what setup learned about the table.
struct Source {
    client: Client,
    /// The table's and its id sequence's oids: the relations whose writers
    /// the barrier waits for.
    relations: Vec<u32>,
    /// The id sequence, if the table has one (bigserial or identity).
    sequence: Option<u32>,
    sql: Sql,
    /// The `application_name` of this consumer's partition connections.
    reader: String,
}

/// Give up on connecting after this, unless the DSN says otherwise.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Unacknowledged data on a consumer's socket fails it after this (a
/// database host gone without a reset), unless the DSN says otherwise.
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(20);

/// What a connection is for: a partition's reader, whose transactions
/// only remove rows, or an operator's request, which may insert.
#[derive(Clone, Copy)]
enum Role {
    Partition,
    Admin,
}

/// The `application_name` of every partition connection of a consumer.
fn reader_name(cfg: &ConsumerConfig) -> String {
    format!("herald consumer {}", cfg.name)
}

/// Open a connection whose notifications wake `notified`.
async fn open(cfg: &ConsumerConfig, notified: Arc<Notify>, role: Role) -> Result<Client, SourceError> {
    let mut pg: tokio_postgres::Config = cfg.dsn.parse()?;
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(CONNECT_TIMEOUT);
    }
    if pg.get_tcp_user_timeout().is_none() {
        pg.tcp_user_timeout(TCP_USER_TIMEOUT);
    }
    // Always ours, whatever the DSN says: the barrier leaves out exactly
    // the sessions named so (see `barrier`).
    pg.application_name(match role {
        Role::Partition => reader_name(cfg),
        Role::Admin => format!("herald consumer {} admin", cfg.name),
    });
    let (client, mut connection) = pg.connect(NoTls).await?;
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(m) = messages.next().await {
            match m {
                Ok(AsyncMessage::Notification(_)) => notified.notify_one(),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        // The connection ended: wake the worker so it sees the closed client.
        notified.notify_one();
    });
    Ok(client)
}

/// Connect, check the table, create the helper tables if missing, listen.
async fn connect(cfg: &ConsumerConfig, notified: Arc<Notify>) -> Result<Source, SourceError> {
    let client = open(cfg, notified, Role::Partition).await?;
    let setup = |m: String| SourceError::Setup(m);
    let table_oid: u32 = client
        .query_opt("SELECT to_regclass($1)::oid", &[&cfg.table])
        .await?
        .and_then(|r| r.get::<_, Option<u32>>(0))
        .ok_or_else(|| {
            setup(format!("table {} does not exist (docs/consumers.md has its DDL)", cfg.table))
        })?;
    let columns = columns_of(&client, &cfg.table).await?;
    let has = |c: &str| columns.iter().any(|x| x == c);
    for required in ["id", "channel", "data"] {
        if !has(required) {
            return Err(setup(format!("table {} has no column {required}", cfg.table)));
        }
    }
    if cfg.after_publish == AfterPublish::Mark && !has("herald_published_at") {
        return Err(setup(format!(
            "after_publish = \"mark\" needs a column herald_published_at timestamptz on {}",
            cfg.table
        )));
    }
    // The optional columns that change what a row means must be of the
    // type the statements compare them as.
    for (column, wanted, accepted) in [
        ("channels", "text[]", &["text[]", "character varying[]"][..]),
        ("deliver_at", "timestamptz", &["timestamp with time zone"][..]),
    ] {
        let ty: Option<String> = client
            .query_opt(
                "SELECT format_type(atttypid, NULL) FROM pg_attribute \
                 WHERE attrelid = $1 AND attname = $2 AND attnum > 0 AND NOT attisdropped",
                &[&table_oid, &column],
            )
            .await?
            .map(|r| r.get(0));
        if let Some(ty) = ty.filter(|ty| !accepted.contains(&ty.as_str())) {
            return Err(setup(format!("column {column} of {} is {ty}; it must be {wanted}", cfg.table)));
        }
    }
    let sequence: Option<u32> = client
        .query_one("SELECT to_regclass(pg_get_serial_sequence($1, 'id'))::oid", &[&cfg.table])
        .await?
        .get(0);
    if let Some(seq) = sequence {
        let cache: i64 = client
            .query_opt("SELECT seqcache FROM pg_sequence WHERE seqrelid = $1", &[&seq])
            .await?
            .map_or(1, |r| r.get(0));
        if cache > 1 {
            return Err(setup(format!(
                "the id sequence of {} has CACHE {cache}: with cached values ids are not taken in order across sessions; ALTER SEQUENCE ... CACHE 1",
                cfg.table
            )));
        }
    }
    for statement in ddl(cfg) {
        if let Err(e) = client.batch_execute(&statement).await {
            // Two partitions creating the same table at once: one wins.
            let raced = e.code().is_some_and(|c| {
                *c == tokio_postgres::error::SqlState::UNIQUE_VIOLATION
                    || *c == tokio_postgres::error::SqlState::DUPLICATE_TABLE
                    || *c == tokio_postgres::error::SqlState::DUPLICATE_OBJECT
            });
            if !raced {
                return Err(e.into());
            }
        }
    }
    let cols = Columns::of(&columns);
    // A dead-letter table made before the outbox had `channels` gets the
    // column, so a parked row keeps every channel it named.
    let dead = cfg.dead_letter();
    if cols.channels && !columns_of(&client, &dead).await?.iter().any(|c| c == "channels") {
        client
            .batch_execute(&format!("ALTER TABLE {dead} ADD COLUMN IF NOT EXISTS channels text[]"))
            .await
            .map_err(|e| {
            setup(format!("{dead} needs a column channels text[] like {} ({})", cfg.table, pg_text(&e)))
        })?;
    }
    // A node frozen inside its removal transaction would hold its locks
    // (and so every other node's barrier and fence) until it wakes:
    // PostgreSQL ends such a transaction after half a lease, and a
    // statement waits for a lock at most a third of one.
    let ttl_ms = cfg.partition_lease_ttl.as_millis();
    client
        .batch_execute(&format!(
            "SET idle_in_transaction_session_timeout = {}; SET lock_timeout = {}",
            (ttl_ms / 2).max(1),
            (ttl_ms / 3).max(1)
        ))
        .await?;
    client.batch_execute(&format!("LISTEN {}", cfg.notify())).await?;
    let sql = Sql::new(cfg, cols);
    let mut relations = vec![table_oid];
    relations.extend(sequence);
    Ok(Source { client, relations, sequence, sql, reader: reader_name(cfg) })
}

/// Raise the partition's fence to `token`: `Err(Lost)` if a greater token
/// is stored (another owner took the partition since).
async fn raise_fence(src: &Source, name: &str, p: usize, token: u64) -> Result<(), SourceError> {
    let sql = format!(
        "INSERT INTO {0} AS s (consumer, partition, fence) VALUES ($1, $2, $3) \
         ON CONFLICT (consumer, partition) DO UPDATE SET fence = greatest(s.fence, excluded.fence), updated_at = now() \
         RETURNING fence",
        src.sql.state
    );
    let fence: i64 = src.client.query_one(&sql, &[&name, &(p as i32), &(token as i64)]).await?.get(0);
    if fence as u64 > token {
        return Err(SourceError::Lost);
    }
    Ok(())
}

/// What one step did.
enum Stepped {
    /// A full batch: there may be more.
    Full,
    /// Fewer rows than a batch, or none: wait for a notification.
    Idle,
    /// A transaction holding an earlier id is still open after the
    /// patience: nothing read; try again.
    Waiting,
}

/// The barrier (see the module docs): the highest id whose fate is known,
/// or `None` while writers holding earlier ids still run after `patience`.
async fn barrier(src: &Source, patience: Duration) -> Result<Option<i64>, SourceError> {
    let high: i64 = match src.sequence {
        Some(seq) => {
            let row =
                src.client.query_one("SELECT pg_sequence_last_value($1::oid::regclass)", &[&seq]).await?;
            match row.get::<_, Option<i64>>(0) {
                Some(v) => v,
                None => return Ok(Some(0)), // never called: no row yet
            }
        }
        // Ids the application assigns itself: only the table's writers are
        // waited for (docs/consumers.md: such ids must grow in commit order).
        None => i64::MAX,
    };
    // Left out: this consumer's own partition connections (on every
    // node), whose transactions only delete or mark rows already read and
    // never take an id; waiting for them would make partitions wait for
    // each other's removals.
    let writers: Vec<String> = src
        .client
        .query_one(
            "SELECT coalesce(array_agg(DISTINCT l.virtualtransaction), '{}') FROM pg_locks l \
             LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.relation = ANY($1) AND l.mode = 'RowExclusiveLock' AND l.pid <> pg_backend_pid() \
             AND a.application_name IS DISTINCT FROM $2",
            &[&src.relations, &src.reader],
        )
        .await?
        .get(0);
    if writers.is_empty() {
        return Ok(Some(high));
    }
    let started = Instant::now();
    let mut delay = Duration::from_millis(1);
    loop {
        let running: i64 = src
            .client
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'virtualxid' AND virtualxid = ANY($1)",
                &[&writers],
            )
            .await?
            .get(0);
        if running == 0 {
            return Ok(Some(high));
        }
        if started.elapsed() >= patience {
            return Ok(None);
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(BARRIER_POLL_MAX);
    }
}

/// Read, publish and remove one batch of partition `p`.
async fn step(
    state: &AppState,
    consumer: &Consumer,
    src: &mut Source,
    p: usize,
    token: u64,
    patience: Duration,
) -> Result<Stepped, SourceError> {
    let cfg = &consumer.cfg;
    let Some(high) = barrier(src, patience).await? else {
        return Ok(Stepped::Waiting);
    };
    let parts = i64::from(cfg.partitions);
    let batch = cfg.batch_size as i64;
    let rows = src.client.query(&src.sql.read, &[&high, &parts, &(p as i64), &batch]).await?;
    let rows: Vec<(i64, Row)> = rows
        .iter()
        .map(|r| {
            let id: i64 = r.get(0);
            let row = Row::new(id.to_string(), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5));
            (id, row)
        })
        .collect();
    if rows.is_empty() {
        return Ok(Stepped::Idle);
    }
    let full = rows.len() as i64 == batch;
    let plain: Vec<Row> = rows.iter().map(|(_, r)| r.clone()).collect();
    let (outcomes, transient) = publish_rows(state, consumer, &plain).await;

    let mut published = Vec::new();
    let (mut parked, mut codes, mut errors) = (Vec::new(), Vec::new(), Vec::new());
    for ((id, _), outcome) in rows.iter().zip(&outcomes) {
        match outcome {
            Some(Outcome::Published { .. }) => published.push(*id),
            Some(Outcome::Park { code, detail }) => {
                parked.push(*id);
                codes.push(code.as_str().to_owned());
                errors.push(detail.clone());
            }
            None => {}
        }
    }
    if !published.is_empty() || !parked.is_empty() {
        finish(src, cfg, p, token, &published, (&parked, &codes, &errors)).await?;
        account(state, consumer, p, &plain, &outcomes);
        let last = published.iter().chain(&parked).max().copied();
        consumer.update(p, |s| {
            if let Some(last) = last {
                let prev = s.last_id.as_deref().and_then(|v| v.parse::<i64>().ok()).unwrap_or(i64::MIN);
                s.last_id = Some(prev.max(last).to_string());
            }
        });
    }
    if let Some(e) = transient {
        return Err(SourceError::Publish(e));
    }
    Ok(if full { Stepped::Full } else { Stepped::Idle })
}

/// Remove (or mark) the published rows and park the refused ones, in one
/// transaction that holds the partition's fence row and still finds
/// `token` there.
async fn finish(
    src: &mut Source,
    cfg: &ConsumerConfig,
    p: usize,
    token: u64,
    published: &[i64],
    (parked, codes, errors): (&[i64], &[String], &[String]),
) -> Result<(), SourceError> {
    let lock =
        format!("SELECT fence FROM {} WHERE consumer = $1 AND partition = $2 FOR UPDATE", src.sql.state);
    let record = format!(
        "UPDATE {} SET last_id = greatest(coalesce(last_id, $3), $3), updated_at = now() \
         WHERE consumer = $1 AND partition = $2",
        src.sql.state
    );
    let tx = src.client.transaction().await?;
    let fence: Option<i64> = tx.query_opt(&lock, &[&cfg.name, &(p as i32)]).await?.map(|r| r.get(0));
    if fence != Some(token as i64) {
        tx.rollback().await?;
        return Err(SourceError::Lost);
    }
    if !parked.is_empty() {
        tx.execute(&src.sql.park, &[&cfg.name, &parked, &codes, &errors]).await?;
        tx.execute(&src.sql.delete, &[&parked]).await?;
    }
    if !published.is_empty() {
        tx.execute(&src.sql.finish_published, &[&published]).await?;
    }
    let last = published.iter().chain(parked).max().copied().unwrap_or(0);
    tx.execute(&record, &[&cfg.name, &(p as i32), &last]).await?;
    tx.commit().await?;
    Ok(())
}

/// Refresh the partition's `lag`, `scheduled_rows` and `parked_rows` and
/// the lag gauge.
async fn observe(state: &AppState, consumer: &Consumer, src: &Source, p: usize) -> Result<(), SourceError> {
    let parts = i64::from(consumer.cfg.partitions);
    let lag: i64 = src.client.query_one(&src.sql.lag, &[&parts, &(p as i64)]).await?.get(0);
    let scheduled: Option<i64> = match &src.sql.scheduled {
        Some(sql) => Some(src.client.query_one(sql, &[&parts, &(p as i64)]).await?.get(0)),
        None => None,
    };
    let parked: i64 =
        src.client.query_one(&src.sql.parked_count, &[&consumer.cfg.name, &parts, &(p as i64)]).await?.get(0);
    consumer.update(p, |s| {
        s.lag = Some(lag as u64);
        s.scheduled_rows = scheduled.map(|n| n as u64);
        s.parked_rows = Some(parked as u64);
    });
    state
        .metrics
        .consumer_lag
        .get_or_create(&[("consumer", consumer.cfg.name.clone()), ("partition", p.to_string())])
        .set(lag);
    Ok(())
}

/// One partition's loop until shutdown: own it, read, publish, remove.
pub async fn run_partition(state: Arc<AppState>, consumer: Arc<Consumer>, p: usize) {
    let cfg = consumer.cfg.clone();
    let notified = Arc::new(Notify::new());
    let mut source: Option<Source> = None;
    let mut lease = PartitionLease::new(&state, &cfg, p);
    let mut backoff = BACKOFF_START;
    let mut observed = Instant::now() - cfg.poll_interval;
    let mut failing = false;
    while !state.shutdown.is_cancelled() {
        let held = match lease.claim(&state, &consumer).await {
            Claim::Held(held) => held,
            Claim::Busy => {
                if !idle(&state, &consumer, &notified, cfg.poll_interval, false).await {
                    break;
                }
                continue;
            }
            Claim::Failed => {
                if !pause(&state, &mut backoff, lease.retry_cap(cfg.max_backoff)).await {
                    break;
                }
                continue;
            }
        };
        if source.as_ref().is_none_or(|s| s.client.is_closed()) {
            let connected = tokio::select! {
                () = state.shutdown.cancelled() => break,
                c = connect(&cfg, notified.clone()) => c,
            };
            match connected {
                Ok(s) => source = Some(s),
                Err(e) => {
                    fail(&state, &consumer, p, &e, &mut failing);
                    if !pause(&state, &mut backoff, cfg.max_backoff).await {
                        break;
                    }
                    continue;
                }
            }
        }
        let src = source.as_mut().expect("connected above");
        let token = held.token;
        if !held.fenced {
            match raise_fence(src, &cfg.name, p, token).await {
                Ok(()) => {
                    lease.fenced(&consumer);
                    tracing::info!(consumer = %cfg.name, partition = p, token, "consumer partition owned");
                }
                Err(e) => {
                    if matches!(e, SourceError::Lost) {
                        lease.lost(&consumer);
                    }
                    fail(&state, &consumer, p, &e, &mut failing);
                    if !pause(&state, &mut backoff, cfg.max_backoff).await {
                        break;
                    }
                    continue;
                }
            }
        }
        // Wait for writers at most until the lease must be renewed.
        let patience = (cfg.partition_lease_ttl / 3)
            .saturating_sub(held.claimed_at.elapsed())
            .max(Duration::from_millis(50));
        // Cancelling a step is safe: an unfinished removal transaction is
        // rolled back, and appends already made are receipts next time.
        let stepped = tokio::select! {
            () = state.shutdown.cancelled() => break,
            r = step(&state, &consumer, src, p, token, patience) => r,
        };
        match stepped {
            Ok(stepped) => {
                backoff = BACKOFF_START;
                if failing {
                    failing = false;
                    tracing::info!(consumer = %cfg.name, partition = p, "consumer partition recovered");
                }
                match stepped {
                    Stepped::Waiting => {
                        consumer.note_error(p, "waiting for a long transaction that holds an earlier id");
                        continue;
                    }
                    Stepped::Full => {
                        consumer.update(p, |s| s.last_error = None);
                        continue;
                    }
                    Stepped::Idle => consumer.update(p, |s| s.last_error = None),
                }
                if observed.elapsed() >= cfg.poll_interval {
                    observed = Instant::now();
                    if let Err(e) = observe(&state, &consumer, src, p).await {
                        fail(&state, &consumer, p, &e, &mut failing);
                    }
                }
                let mut wait = cfg.poll_interval.min(lease.renew_in().unwrap_or(Duration::MAX));
                // Wake when the earliest scheduled row is due (a little
                // after: it is read once PostgreSQL's clock has passed it).
                match next_due(&cfg, src, p).await {
                    Ok(Some(due)) => wait = wait.min(due + SCHEDULE_MARGIN),
                    Ok(None) => {}
                    Err(e) => fail(&state, &consumer, p, &e, &mut failing),
                }
                if !idle(&state, &consumer, &notified, wait, true).await {
                    break;
                }
            }
            Err(e) => {
                if matches!(e, SourceError::Lost) {
                    tracing::info!(consumer = %cfg.name, partition = p, "consumer partition lost to a greater fencing token");
                    lease.lost(&consumer);
                }
                fail(&state, &consumer, p, &e, &mut failing);
                if !pause(&state, &mut backoff, cfg.max_backoff).await {
                    break;
                }
            }
        }
    }
    lease.release(&state, &consumer).await;
}

/// How long until the partition's earliest scheduled row is due (`None`:
/// no scheduled row, or the table has no `deliver_at`), by PostgreSQL's
/// clock.
async fn next_due(cfg: &ConsumerConfig, src: &Source, p: usize) -> Result<Option<Duration>, SourceError> {
    let Some(sql) = &src.sql.next_due else { return Ok(None) };
    let parts = i64::from(cfg.partitions);
    let ms: Option<i64> = src.client.query_one(sql, &[&parts, &(p as i64)]).await?.get(0);
    Ok(ms.map(|ms| Duration::from_millis(ms.max(0) as u64)))
}

/// Record a failure: the status API, the error counter, a warning when the
/// partition starts failing (then quiet until it recovers).
fn fail(state: &AppState, consumer: &Consumer, p: usize, e: &SourceError, failing: &mut bool) {
    consumer.note_error(p, e);
    state.metrics.consumer_errors.get_or_create(&[("consumer", consumer.cfg.name.clone())]).inc();
    if !*failing {
        *failing = true;
        tracing::warn!(consumer = %consumer.cfg.name, partition = p, error = %e, "consumer partition failing; retrying with backoff");
    }
}

/// Sleep up to `wait`, woken early by a notification (when `listen`) or
/// the retry API. `false` on shutdown.
async fn idle(
    state: &AppState,
    consumer: &Consumer,
    notified: &Notify,
    wait: Duration,
    listen: bool,
) -> bool {
    tokio::select! {
        () = state.shutdown.cancelled() => false,
        () = notified.notified(), if listen => true,
        () = consumer.wake.notified() => true,
        () = tokio::time::sleep(wait) => true,
    }
}

/// A parked row, for the API.
pub struct Parked {
    pub id: i64,
    pub channel: Option<String>,
    /// The row's `channels`, when the outbox has that column.
    pub channels: Option<Vec<Option<String>>>,
    pub code: String,
    pub error: String,
    pub parked_at_ms: u64,
}

/// The consumer's parked rows, oldest first (one short connection: an
/// operator's request).
pub async fn list_parked(cfg: &ConsumerConfig, limit: i64) -> Result<Vec<Parked>, SourceError> {
    let client = open(cfg, Arc::new(Notify::new()), Role::Admin).await?;
    let dead = cfg.dead_letter();
    let has_channels = columns_of(&client, &dead).await?.iter().any(|c| c == "channels");
    let channels = if has_channels { "channels::text[]" } else { "NULL::text[]" };
    let sql = format!(
        "SELECT id, channel, code, error, (extract(epoch FROM parked_at) * 1000)::bigint, {channels} FROM {dead} \
         WHERE consumer = $1 ORDER BY id LIMIT $2"
    );
    let rows = client.query(&sql, &[&cfg.name, &limit]).await?;
    Ok(rows
        .iter()
        .map(|r| Parked {
            id: r.get(0),
            channel: r.get(1),
            code: r.get(2),
            error: r.get(3),
            parked_at_ms: r.get::<_, i64>(4) as u64,
            channels: r.get(5),
        })
        .collect())
}

/// Put a parked row back into the outbox as a new row (a new id: it is
/// published after the rows already there). `None`: no such parked row.
pub async fn retry_parked(cfg: &ConsumerConfig, id: i64) -> Result<Option<i64>, SourceError> {
    let client = open(cfg, Arc::new(Notify::new()), Role::Admin).await?;
    let columns = columns_of(&client, &cfg.table).await?;
    let dead_columns = columns_of(&client, &cfg.dead_letter()).await?;
    let mut cols = vec!["channel", "data"];
    for optional in ["meta", "idempotency_key", "channels"] {
        if columns.iter().any(|c| c == optional) && dead_columns.iter().any(|c| c == optional) {
            cols.push(optional);
        }
    }
    let list = cols.join(", ");
    let sql = format!(
        "WITH d AS (DELETE FROM {dead} WHERE consumer = $1 AND id = $2 RETURNING {list}) \
         INSERT INTO {t} ({list}) SELECT {list} FROM d RETURNING id",
        dead = cfg.dead_letter(),
        t = cfg.table
    );
    Ok(client.query_opt(&sql, &[&cfg.name, &id]).await?.map(|r| r.get(0)))
}
