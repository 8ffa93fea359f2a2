//! Connections to Redis: a small pool of multiplexed command connections
//! (reconnecting with backoff by themselves), the pub/sub connection, the
//! timeout around every call and the health that makes calls fail fast
//! while Redis is unreachable.
//!
//! Invariants:
//! - no call waits longer than the command timeout (plus the connect
//!   timeout of a reconnect in progress, also bounded);
//! - while Redis is known to be unreachable every call fails at once with
//!   `EngineError::Unavailable`; a probe (`probe`) notices the recovery;
//! - the number of sockets per Redis node is `connections + 1` (pub/sub).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_core::EngineError;
use redis::aio::AsyncPushSender;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Client, Cmd, ErrorKind, Pipeline, ProtocolVersion, RedisFuture, Value};

use crate::{RedisConfig, RedisError};

/// Reconnect attempts of one reconnect round (the next command or probe
/// starts another round), and the longest wait between two attempts.
const RECONNECT_ATTEMPTS: usize = 6;
const RECONNECT_MAX_DELAY: Duration = Duration::from_secs(1);

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
}

impl HealthState {
    pub fn down_reason(&self) -> Option<String> {
        self.down
            .load(Ordering::Acquire)
            .then(|| self.reason.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    fn mark_down(&self, reason: String) {
        let mut r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        if !self.down.swap(true, Ordering::AcqRel) {
            tracing::warn!(reason = %reason, "redis unavailable");
        }
        *r = reason;
    }

    fn mark_up(&self) {
        if self.down.load(Ordering::Acquire) && self.down.swap(false, Ordering::AcqRel) {
            tracing::info!("redis available again");
        }
    }
}

/// Whether an error means Redis (or the way to it) is down, rather than a
/// refused command.
fn is_outage(e: &redis::RedisError) -> bool {
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

/// The command side: a pool of connections, the timeout, the health.
pub(crate) struct Redis {
    conns: Vec<Conn>,
    next: AtomicUsize,
    timeout: Duration,
    pub health: Arc<HealthState>,
    pub cluster: bool,
}

impl Redis {
    pub async fn connect(config: &RedisConfig) -> Result<Self, RedisError> {
        let mut conns = Vec::with_capacity(config.connections);
        for _ in 0..config.connections {
            conns.push(open_conn(config, ProtocolVersion::RESP2, None).await?);
        }
        Ok(Self {
            conns,
            next: AtomicUsize::new(0),
            timeout: config.command_timeout,
            health: Arc::new(HealthState::default()),
            cluster: config.is_cluster(),
        })
    }

    pub fn conn(&self) -> Conn {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        self.conns[i].clone()
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
        match tokio::time::timeout(self.timeout, f(self.conn())).await {
            Ok(Ok(v)) => {
                self.health.mark_up();
                Ok(v)
            }
            Ok(Err(e)) => {
                let reason = format!("redis {what}: {e}");
                if is_outage(&e) {
                    self.health.mark_down(reason.clone());
                } else {
                    tracing::warn!(error = %e, what, "redis refused a command");
                }
                Err(EngineError::Unavailable(reason))
            }
            Err(_) => {
                let reason = format!("redis {what}: no answer within {:?}", self.timeout);
                self.health.mark_down(reason.clone());
                Err(EngineError::Unavailable(reason))
            }
        }
    }

    /// One PING on every pooled connection (which also makes a connection
    /// whose reconnect round gave up start another); updates the health.
    pub async fn probe(&self) {
        for conn in &self.conns {
            let conn = conn.clone();
            let r = self
                .call_unchecked("ping", |_| async move {
                    let mut conn = conn;
                    redis::cmd("PING").query_async::<()>(&mut conn).await
                })
                .await;
            if r.is_err() {
                return;
            }
        }
    }
}

/// Open one connection (single instance or cluster). `push` receives the
/// RESP3 pushes (pub/sub messages, disconnections); with it, subscriptions
/// are restored after every reconnect.
pub(crate) async fn open_conn(
    config: &RedisConfig,
    protocol: ProtocolVersion,
    push: Option<Arc<dyn AsyncPushSender>>,
) -> Result<Conn, RedisError> {
    let connect = async {
        if config.is_cluster() {
            let mut b = ClusterClientBuilder::new(config.urls.clone())
                .use_protocol(protocol)
                .connection_timeout(config.connect_timeout)
                .response_timeout(config.command_timeout)
                .retries(2)
                .max_retry_wait(RECONNECT_MAX_DELAY.as_millis() as u64);
            if let Some(push) = push {
                b = b.push_sender(push);
            }
            let client = b.build()?;
            Ok::<_, redis::RedisError>(Conn::Cluster(client.get_async_connection().await?))
        } else {
            let client = Client::open(config.urls[0].as_str())?;
            let info = client.get_connection_info().clone();
            let settings = info.redis_settings().clone().set_protocol(protocol);
            let client = Client::open(info.set_redis_settings(settings))?;
            let mut c = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(config.connect_timeout))
                .set_response_timeout(Some(config.command_timeout))
                .set_number_of_retries(RECONNECT_ATTEMPTS)
                .set_max_delay(RECONNECT_MAX_DELAY);
            if let Some(push) = push {
                c = c.set_push_sender(push).set_automatic_resubscription();
            }
            Ok(Conn::Single(client.get_connection_manager_with_config(c).await?))
        }
    };
    let limit = config.connect_timeout * 2;
    match tokio::time::timeout(limit, connect).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(RedisError::Connect(e.to_string())),
        Err(_) => Err(RedisError::Connect(format!("no connection within {limit:?}"))),
    }
}
