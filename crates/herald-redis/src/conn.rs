//! Connections to Redis: a small pool of multiplexed command connections,
//! the timeout around every call, the health that makes calls fail fast
//! while Redis is unreachable, and the replacement of a connection that
//! stopped answering (see `dial.rs` for why).
//!
//! Invariants:
//! - no call waits longer than the command timeout (plus the connect
//!   timeout of a reconnect in progress, also bounded);
//! - while Redis is known to be unreachable every call fails at once with
//!   `EngineError::Unavailable`; a probe (`probe`, every connection at
//!   once) notices the recovery;
//! - a connection whose call timed out or failed for an outage is marked
//!   bad and (single instance) replaced by a fresh one, at most once per
//!   `REDIAL_MIN`; calls prefer connections that answered, so one that is
//!   still coming back does not fail the others' calls;
//! - a failure marks Redis down only if no call was answered since it
//!   began: a late failure on a connection replaced meanwhile does not
//!   undo a recovery;
//! - the number of live sockets per Redis node is `connections + 1`
//!   (pub/sub), plus replaced ones while they close.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_core::EngineError;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, Pipeline, ProtocolVersion, RedisFuture, Value};
use tokio::time::Instant;

use crate::dial::{open_conn, redial};
use crate::reply::{failure, Reply};
use crate::scripts::ScriptArgs;
use crate::{RedisConfig, RedisError};

/// A connection is replaced at most this often.
pub(crate) const REDIAL_MIN: Duration = Duration::from_millis(500);

/// One command connection: a single instance or a whole cluster.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Whether Redis answers, as the engine last saw it.
#[derive(Default)]
pub(crate) struct HealthState {
    down: AtomicBool,
    reason: Mutex<String>,
    /// Calls answered so far: a failure marks Redis down only if nothing
    /// was answered since the failed call began (a late failure of a call
    /// on a connection replaced meanwhile does not undo a recovery).
    answered: AtomicU64,
}

impl HealthState {
    pub fn down_reason(&self) -> Option<String> {
        self.down
            .load(Ordering::Acquire)
            .then(|| self.reason.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    fn answered(&self) -> u64 {
        self.answered.load(Ordering::Acquire)
    }

    /// A call that began when `answered` was `since` failed for an outage.
    fn failed_since(&self, since: u64, reason: String) {
        if self.answered() == since {
            self.mark_down(reason);
        }
    }

    fn mark_down(&self, reason: String) {
        let mut r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        if !self.down.swap(true, Ordering::AcqRel) {
            tracing::warn!(reason = %reason, "redis unavailable");
        }
        *r = reason;
    }

    fn mark_up(&self) {
        self.answered.fetch_add(1, Ordering::AcqRel);
        if self.down.load(Ordering::Acquire) && self.down.swap(false, Ordering::AcqRel) {
            tracing::info!("redis available again");
        }
    }
}

/// Whether an error means Redis (or the way to it) is down, rather than a
/// refused command.
pub(crate) fn is_outage(e: &redis::RedisError) -> bool {
    match e.kind() {
        ErrorKind::Server(k) => !matches!(
            k,
            redis::ServerErrorKind::ResponseError
                | redis::ServerErrorKind::ExecAbort
                | redis::ServerErrorKind::NoScript
                | redis::ServerErrorKind::CrossSlot
                | redis::ServerErrorKind::NoPerm
                | redis::ServerErrorKind::NoSub
                | redis::ServerErrorKind::NotBusy
        ),
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType | ErrorKind::InvalidClientConfig => false,
        _ => true,
    }
}

/// One pooled command connection.
struct Slot {
    current: Mutex<SlotConn>,
    /// Its last call was answered (or it was not tried since it was made).
    ok: AtomicBool,
}

struct SlotConn {
    conn: Conn,
    /// Bumped at each replacement: a failure of an earlier connection says
    /// nothing about this one.
    generation: u64,
    made: Instant,
}

/// The command side: a pool of connections, the timeout, the health.
pub(crate) struct Redis {
    slots: Vec<Slot>,
    next: AtomicUsize,
    timeout: Duration,
    config: RedisConfig,
    pub health: Arc<HealthState>,
    pub cluster: bool,
}

impl Redis {
    pub async fn connect(config: &RedisConfig) -> Result<Self, RedisError> {
        let mut slots = Vec::with_capacity(config.connections);
        for _ in 0..config.connections {
            let conn = open_conn(config, ProtocolVersion::RESP2, None).await?;
            let current = SlotConn { conn, generation: 0, made: Instant::now() };
            slots.push(Slot { current: Mutex::new(current), ok: AtomicBool::new(true) });
        }
        Ok(Self {
            slots,
            next: AtomicUsize::new(0),
            timeout: config.command_timeout,
            config: config.clone(),
            health: Arc::new(HealthState::default()),
            cluster: config.is_cluster(),
        })
    }

    /// The next connection in turn that answered its last call (any, if
    /// none did).
    fn pick(&self) -> usize {
        let n = self.slots.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        (0..n).map(|k| (start + k) % n).find(|&i| self.slots[i].ok.load(Ordering::Acquire)).unwrap_or(start)
    }

    fn conn_at(&self, i: usize) -> (u64, Conn) {
        let c = self.slots[i].current.lock().unwrap_or_else(|e| e.into_inner());
        (c.generation, c.conn.clone())
    }

    /// The connection `generation` at `i` failed: mark it bad and replace
    /// it with a fresh one, unless it was made less than `REDIAL_MIN` ago.
    /// A connection replaced already is left alone.
    fn failed(&self, i: usize, generation: u64) {
        let slot = &self.slots[i];
        let mut c = slot.current.lock().unwrap_or_else(|e| e.into_inner());
        if c.generation != generation {
            return;
        }
        slot.ok.store(false, Ordering::Release);
        if c.made.elapsed() < REDIAL_MIN {
            return;
        }
        if let Some(fresh) = redial(&self.config, ProtocolVersion::RESP2, None) {
            *c = SlotConn { conn: fresh, generation: generation + 1, made: Instant::now() };
            tracing::debug!(slot = i, "redis connection replaced");
        }
    }

    /// Run `f` on a connection, failing fast while Redis is down, within
    /// the command timeout. Any failure is `Unavailable` (transient: the
    /// server answers 503).
    pub async fn call<T, F, Fut>(&self, what: &'static str, f: F) -> Result<T, EngineError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        if let Some(reason) = self.health.down_reason() {
            return Err(EngineError::Unavailable(reason));
        }
        self.call_unchecked(what, f).await
    }

    /// Run a script with `args` through [`call`](Self::call).
    pub async fn run(&self, what: &'static str, args: &impl ScriptArgs) -> Result<Reply, EngineError> {
        let inv = args.invocation();
        let v = self.call(what, |mut c| async move { inv.invoke_async::<Value>(&mut c).await }).await?;
        Reply::new(what, v)
    }

    /// Run a script with `args` through [`call_unchecked`](Self::call_unchecked).
    pub async fn run_unchecked(
        &self,
        what: &'static str,
        args: &impl ScriptArgs,
    ) -> Result<Reply, EngineError> {
        let inv = args.invocation();
        let v =
            self.call_unchecked(what, |mut c| async move { inv.invoke_async::<Value>(&mut c).await }).await?;
        Reply::new(what, v)
    }

    /// Up to `count` members of the sorted set `key` in lex order, from the
    /// `ZRANGEBYLEX` bound `start` (`-`, `[member` or `(member`): one page of
    /// a paged listing.
    pub async fn lex_page<T>(
        &self,
        what: &'static str,
        key: String,
        start: Vec<u8>,
        count: usize,
    ) -> Result<Vec<T>, EngineError>
    where
        T: redis::FromRedisValue,
    {
        self.call(what, |mut c| async move {
            redis::cmd("ZRANGEBYLEX")
                .arg(key)
                .arg(start)
                .arg("+")
                .arg("LIMIT")
                .arg(0)
                .arg(count)
                .query_async(&mut c)
                .await
        })
        .await
    }

    /// `call` without the fail-fast check (for the probe and the fan-out's
    /// own loops, which must notice the recovery).
    pub async fn call_unchecked<T, F, Fut>(&self, what: &'static str, f: F) -> Result<T, EngineError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        self.call_on(self.pick(), what, f).await
    }

    async fn call_on<T, F, Fut>(&self, i: usize, what: &'static str, f: F) -> Result<T, EngineError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let since = self.health.answered();
        let (generation, conn) = self.conn_at(i);
        match tokio::time::timeout(self.timeout, f(conn)).await {
            Ok(Ok(v)) => {
                if self.conn_at(i).0 == generation {
                    self.slots[i].ok.store(true, Ordering::Release);
                }
                self.health.mark_up();
                Ok(v)
            }
            Ok(Err(e)) => {
                if is_outage(&e) {
                    self.failed(i, generation);
                    self.health.failed_since(since, format!("redis {what}: {e}"));
                } else {
                    tracing::warn!(error = %e, what, "redis refused a command");
                }
                Err(failure(what, &e))
            }
            Err(_) => {
                let reason = format!("redis {what}: no answer within {:?}", self.timeout);
                self.failed(i, generation);
                self.health.failed_since(since, reason.clone());
                Err(EngineError::Unavailable(reason))
            }
        }
    }

    /// One PING on every pooled connection at once (which also starts a
    /// reconnect of one whose library round gave up, and replaces one that
    /// does not answer); an answer marks Redis up.
    pub async fn probe(&self) {
        let pings = (0..self.slots.len()).map(|i| {
            self.call_on(i, "ping", |mut c| async move { redis::cmd("PING").query_async::<()>(&mut c).await })
        });
        futures_util::future::join_all(pings).await;
    }
}
