//! The node's lease: `<prefix>:node:{id}` with a TTL, refreshed by a
//! keep-alive loop. A lease found gone (expired while Redis was away, or
//! lost with Redis's data) or held by another token (two processes with one
//! node id) is registered again, logged and counted, and the re-registration
//! is published on a `watch` channel for state tied to the node's liveness.
//! Presence does not need it: member leases are renewed per connection, and
//! a renew that finds its lease gone asks for it back once the connection
//! shows it is alive (docs/redis.md, "Node liveness").

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::keys::Keys;
use crate::scripts::{NodeLeaseKeep, NodeLeaseRelease};
use crate::state::EngineState;

pub(crate) struct NodeLease {
    pub key: String,
    pub token: String,
    pub ttl: Duration,
    /// Count of re-registrations so far (0 until the first).
    pub events: watch::Sender<u64>,
}

impl NodeLease {
    pub fn new(keys: &Keys, node_id: &str, ttl: Duration) -> Self {
        Self {
            key: keys.node(node_id),
            token: format!("{node_id}/{}", uuid::Uuid::new_v4().simple()),
            ttl,
            events: watch::Sender::new(0),
        }
    }
}

/// Refresh the lease every third of its TTL until cancelled.
pub(crate) async fn keep_alive(
    inner: Arc<EngineState>,
    lease: Arc<NodeLease>,
    cancel: tokio_util::sync::CancellationToken,
) {
    let ttl_ms = u64::try_from(lease.ttl.as_millis()).unwrap_or(u64::MAX);
    let mut registered = false;
    loop {
        let args = NodeLeaseKeep { lease: &lease.key, token: &lease.token, ttl_ms };
        let r = inner.redis.run_unchecked("lease", &args).await.and_then(|r| r.signed("lease"));
        let ok = r.is_ok();
        match r {
            Ok(0) => {}
            Ok(code) if !registered => {
                if code == 2 {
                    tracing::warn!(lease = %lease.key, "node lease was held by another process (same node id?); taken over");
                }
                tracing::info!(lease = %lease.key, "node lease registered");
            }
            Ok(code) => {
                inner.counters.lease_reregistrations.bump();
                lease.events.send_modify(|n| *n += 1);
                if code == 2 {
                    tracing::error!(lease = %lease.key, "node lease held by another process (same node id?); registered again");
                } else {
                    tracing::warn!(lease = %lease.key, "node lease was lost (expired or gone from redis); registered again");
                }
            }
            Err(e) => tracing::debug!(error = %e, "lease refresh failed; retrying"),
        }
        if ok {
            registered = true;
        }
        // Retry sooner after a failure, so a lease that lapsed while Redis
        // was away comes back soon after Redis does.
        let wait = if ok { lease.ttl / 3 } else { (lease.ttl / 10).max(Duration::from_millis(50)) };
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Remove the lease if it is still ours (clean shutdown).
pub(crate) async fn release(inner: &EngineState, lease: &NodeLease) {
    let args = NodeLeaseRelease { lease: &lease.key, token: &lease.token };
    let r = inner.redis.run_unchecked("lease release", &args).await.and_then(|r| r.signed("released"));
    if let Err(e) = r {
        tracing::debug!(error = %e, "lease release failed (it expires by itself)");
    }
}
