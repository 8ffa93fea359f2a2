//! The hub: which local connections subscribe to which channel, and the
//! engine's fan-out sink.
//!
//! Invariants:
//! - fan-out never awaits: each subscriber gets a `try_send` of the shared
//!   `Arc<Message>` (encoded once); a full outbox applies the channel's policy
//!   (durable: kick the connection as a slow consumer, it resumes from the
//!   log; volatile: drop for that connection and count);
//! - the hub holds only small handles (id, bounded sender, kick token); the
//!   session task owns everything else and removes its entries on every exit
//!   path (see `session::Registrations`).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use herald_core::{FanoutSink, Message};
use herald_proto::ChannelName;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

const SHARDS: usize = 32;

/// What the hub knows about one connection.
#[derive(Clone)]
pub struct ConnHandle {
    pub id: u64,
    /// Bounded. flume rather than tokio's mpsc because it allocates its
    /// queue lazily: an idle connection's outbox costs ~100 bytes instead of
    /// a preallocated block (memory per idle connection matters).
    pub outbox_tx: flume::Sender<Arc<Message>>,
    /// Cancelled when the connection must go as a slow consumer.
    pub slow: CancellationToken,
}

pub struct Hub {
    shards: Vec<RwLock<HashMap<ChannelName, Vec<ConnHandle>>>>,
    metrics: Arc<Metrics>,
}

impl Hub {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(), metrics }
    }

    fn shard(&self, channel: &ChannelName) -> &RwLock<HashMap<ChannelName, Vec<ConnHandle>>> {
        use std::hash::{BuildHasher, RandomState};
        static HASHER: std::sync::OnceLock<RandomState> = std::sync::OnceLock::new();
        let h = HASHER.get_or_init(RandomState::new).hash_one(channel.as_str());
        &self.shards[(h as usize) % SHARDS]
    }

    /// Add a subscriber. Watching the channel is the engine's business: the
    /// session calls `Log::watch` for each subscription, and the engine
    /// counts them (`herald_core::feed::Watches`).
    pub fn add(&self, channel: &ChannelName, conn: ConnHandle) {
        let mut map = self.shard(channel).write().expect("hub lock poisoned");
        map.entry(channel.clone()).or_default().push(conn);
    }

    /// Remove a subscriber (the session then calls `Log::unwatch`).
    pub fn remove(&self, channel: &ChannelName, conn_id: u64) {
        let mut map = self.shard(channel).write().expect("hub lock poisoned");
        let Some(subs) = map.get_mut(channel) else { return };
        subs.retain(|c| c.id != conn_id);
        if subs.is_empty() {
            map.remove(channel);
        }
    }

    /// Local subscribers of a channel (for tests and metrics).
    pub fn subscriber_count(&self, channel: &ChannelName) -> usize {
        self.shard(channel).read().expect("hub lock poisoned").get(channel).map_or(0, Vec::len)
    }
}

impl FanoutSink for Hub {
    fn deliver(&self, msg: Arc<Message>) {
        let map = self.shard(&msg.channel).read().expect("hub lock poisoned");
        let Some(subs) = map.get(&msg.channel) else { return };
        for conn in subs {
            match conn.outbox_tx.try_send(msg.clone()) {
                Ok(()) => {}
                Err(flume::TrySendError::Full(_)) => {
                    if msg.seq.is_some() {
                        // The log has it: the client resumes from its last seq.
                        if !conn.slow.is_cancelled() {
                            conn.slow.cancel();
                        }
                    } else {
                        self.metrics.volatile_dropped.inc();
                    }
                }
                // The session is exiting; its cleanup removes this entry.
                Err(flume::TrySendError::Disconnected(_)) => {}
            }
        }
    }
}
