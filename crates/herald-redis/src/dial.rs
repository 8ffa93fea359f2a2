//! Opening connections to Redis: the TCP settings every socket gets, the
//! first connection (eager: the engine does not open without Redis) and
//! the fresh ones that replace a connection that stopped answering (lazy:
//! dialled on first use, so a redial while Redis is unreachable costs
//! nothing until the next call).
//!
//! Why redial at all: a connection that had a request in flight when the
//! network went away is stuck in TCP retransmission backoff (the gaps grow
//! to a minute and more), so after the network heals it would stay silent
//! for as long again. A fresh connection's SYN is sent at once. Every
//! socket also gets keepalive (an idle connection to a vanished peer is
//! noticed) and `TCP_USER_TIMEOUT` (data unacknowledged for that long
//! aborts the connection), which also bound what the redials do not cover
//! (the cluster client's own connections).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{AsyncPushSender, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::io::tcp::{socket2, TcpSettings};
use redis::{Client, ProtocolVersion};

use crate::conn::Conn;
use crate::{RedisConfig, RedisError};

/// Reconnect attempts of one reconnect round of the client library (the
/// next command or probe starts another round), and the longest wait
/// between two attempts.
const RECONNECT_ATTEMPTS: usize = 6;
const RECONNECT_MAX_DELAY: Duration = Duration::from_secs(1);
/// Keepalive probes: every second once a connection was idle for the
/// command timeout, three unanswered ones end it.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
const KEEPALIVE_RETRIES: u32 = 3;

/// The TCP settings of every Redis socket: keepalive after the command
/// timeout of silence, and data left unacknowledged for twice the command
/// timeout ends the connection (`TCP_USER_TIMEOUT`). A paused Redis still
/// acknowledges (its kernel does), so only a lost peer or path trips it.
pub(crate) fn tcp_settings(config: &RedisConfig) -> TcpSettings {
    let idle = config.command_timeout.max(Duration::from_secs(1));
    let keepalive = socket2::TcpKeepalive::new().with_time(idle);
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "macos", target_os = "freebsd"))]
    let keepalive = keepalive.with_interval(KEEPALIVE_INTERVAL).with_retries(KEEPALIVE_RETRIES);
    let settings = TcpSettings::default().set_keepalive(keepalive);
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let settings = settings.set_user_timeout(user_timeout(config));
    settings
}

/// `TCP_USER_TIMEOUT` of every socket.
pub(crate) fn user_timeout(config: &RedisConfig) -> Duration {
    config.command_timeout * 2
}

/// What a single instance's connections are made from.
fn single(
    config: &RedisConfig,
    protocol: ProtocolVersion,
    push: Option<Arc<dyn AsyncPushSender>>,
) -> redis::RedisResult<(Client, ConnectionManagerConfig)> {
    let client = Client::open(config.urls[0].as_str())?;
    let info = client.get_connection_info().clone();
    let settings = info.redis_settings().clone().set_protocol(protocol);
    let client = Client::open(info.set_redis_settings(settings).set_tcp_settings(tcp_settings(config)))?;
    let mut c = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(config.command_timeout))
        .set_number_of_retries(RECONNECT_ATTEMPTS)
        .set_max_delay(RECONNECT_MAX_DELAY);
    if let Some(push) = push {
        c = c.set_push_sender(push).set_automatic_resubscription();
    }
    Ok((client, c))
}

/// Open one connection (single instance or cluster) and wait until it is
/// up. `push` receives the RESP3 pushes (pub/sub messages,
/// disconnections); with it, subscriptions are restored after every
/// reconnect of the library.
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
                .tcp_settings(tcp_settings(config))
                .retries(2)
                .max_retry_wait(RECONNECT_MAX_DELAY.as_millis() as u64);
            if let Some(push) = push {
                b = b.push_sender(push);
            }
            let client = b.build()?;
            Ok::<_, redis::RedisError>(Conn::Cluster(client.get_async_connection().await?))
        } else {
            let (client, c) = single(config, protocol, push)?;
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

/// A fresh connection to a single instance, dialled on its first use.
/// `None` on a cluster: the cluster client replaces its node connections
/// itself (bounded by the TCP settings).
pub(crate) fn redial(
    config: &RedisConfig,
    protocol: ProtocolVersion,
    push: Option<Arc<dyn AsyncPushSender>>,
) -> Option<Conn> {
    if config.is_cluster() {
        return None;
    }
    let made = single(config, protocol, push)
        .and_then(|(client, c)| ConnectionManager::new_lazy_with_config(client, c));
    match made {
        Ok(m) => Some(Conn::Single(m)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot make a fresh redis connection");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_socket_gets_keepalive_and_a_user_timeout() {
        let mut config = RedisConfig::new("redis://127.0.0.1:6379");
        config.command_timeout = Duration::from_secs(3);
        let settings = tcp_settings(&config);
        assert!(settings.keepalive().is_some());
        #[cfg(any(target_os = "linux", target_os = "android"))]
        assert_eq!(settings.user_timeout(), Some(Duration::from_secs(6)));
    }
}
