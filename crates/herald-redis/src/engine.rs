//! [`RedisEngine`]: the handle the server holds.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use herald_core::{
    AckError, AppendRequest, CursorAck, CursorState, Cursors, EngineError, EngineMetric, FanoutSink, Health,
    Joined, Lease, LeaseJoin, LeaseLeave, LeaseRejoin, LeaseRenew, Lifecycle, Log, Page, Position, Presence,
    Receipt, Rejoined, Renewed, Room, RoomWrite, RoomWritten, Rooms, Seq, SubscriberId, UserCursor,
};
use herald_core::{Admission, Ban, Control, ControlSink, NodeView};
use herald_core::{Claim, Delivered, Schedule, ScheduleReceipt, ScheduleRequest, Schedules};
use herald_proto::ChannelName;
use redis::ProtocolVersion;
use tokio::sync::{mpsc, watch};

use crate::conn::Redis;
use crate::dial::open_conn;
use crate::fanout::{self, Fanout};
use crate::keys::Keys;
use crate::lease::{self, NodeLease};
use crate::scripts::{OwnClaim, OwnRelease};
use crate::state::{self, EngineState};
use crate::{RedisConfig, RedisError, RedisStats};

/// How long `close` waits for the background tasks.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// The Redis engine. See the crate docs.
pub struct RedisEngine {
    inner: Arc<EngineState>,
    /// The control channel (`control.rs`).
    bus: crate::control::Bus,
    lease: Arc<NodeLease>,
    node_id: String,
}

impl RedisEngine {
    /// Connect (every pooled connection and the pub/sub connection), then
    /// start the fan-out, the periodic checks and the lease. Fails if Redis
    /// cannot be reached now; later outages are survived.
    pub async fn open(config: RedisConfig) -> Result<Self, RedisError> {
        config.validate()?;
        let redis = Redis::connect(&config).await?;
        let (push_tx, push_rx) = mpsc::channel(config.fanout_queue);
        let load = Arc::new(fanout::PushLoad::new(config.fanout_queue_bytes));
        let sender = fanout::push_sender(push_tx, load.clone());
        let push: Arc<dyn redis::aio::AsyncPushSender> = Arc::new(sender);
        let pubsub = open_conn(&config, ProtocolVersion::RESP3, Some(push.clone())).await?;
        let keys = Keys::new(&config.key_prefix);
        let fanout = Fanout::new(pubsub, push, keys.clone(), &config, load);
        // A sweeper's claim outlives its two round trips per channel.
        let sweep_claim_ms = state::ms(config.command_timeout * 3);
        let inner = Arc::new(EngineState::new(redis, fanout, keys.clone(), sweep_claim_ms));
        let node_id =
            config.node_id.clone().unwrap_or_else(|| format!("herald-{}", uuid::Uuid::new_v4().simple()));
        let lease = Arc::new(NodeLease::new(&keys, &node_id, config.lease_ttl));
        let fan = &inner.fanout;
        fan.tasks.spawn(fanout::run_dispatcher(inner.clone(), push_rx));
        fan.tasks.spawn(fanout::run_checker(inner.clone()));
        fan.tasks.spawn(lease::keep_alive(inner.clone(), lease.clone(), fan.cancel.clone()));
        let bus = crate::control::Bus::open(&config, &fan.tasks, fan.cancel.clone()).await?;
        tracing::info!(
            urls = config.urls.len(),
            cluster = config.is_cluster(),
            node_id = %node_id,
            key_prefix = %config.key_prefix,
            connections = config.connections,
            command_timeout = ?config.command_timeout,
            "redis engine open"
        );
        Ok(Self { inner, bus, lease, node_id })
    }

    /// The engine's counters, for metrics.
    pub fn stats(&self) -> RedisStats {
        self.inner.counters.snapshot()
    }

    /// This node's id (its lease is `<key_prefix>:node:{id}`).
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Changes every time the node's lease was found lost and registered
    /// again (the value counts them), for state tied to the node's
    /// liveness. Presence needs nothing from it: every connection renews
    /// its leases every third of their TTL and, when a renew finds its
    /// lease gone, asks for it back once its peer answers a ping (see
    /// docs/redis.md, "Node liveness").
    pub fn lease_reregistrations(&self) -> watch::Receiver<u64> {
        self.lease.events.subscribe()
    }

    /// Channels this node watches (subscribed on pub/sub).
    pub fn watched_channels(&self) -> usize {
        self.inner.fanout.watched()
    }
}

#[async_trait]
impl Log for RedisEngine {
    fn set_sink(&self, sink: Arc<dyn FanoutSink>) {
        if self.inner.sink.set(sink).is_err() {
            tracing::warn!("fan-out sink installed twice; the first stays");
        }
    }

    async fn append(&self, req: AppendRequest) -> Result<Receipt, EngineError> {
        self.inner.append(req).await
    }

    /// The dedup claims in one round trip, then one `APPEND` script run per
    /// channel, all in one pipeline (see `append.rs`).
    async fn append_batch(&self, reqs: Vec<AppendRequest>) -> Vec<Result<Receipt, EngineError>> {
        self.inner.append_batch(reqs).await
    }

    async fn position(&self, channel: &ChannelName) -> Result<Position, EngineError> {
        Ok(self.inner.read_raw(channel, 0, 0, true).await?.position)
    }

    async fn read(&self, channel: &ChannelName, after: Seq, limit: usize) -> Result<Page, EngineError> {
        let page = self.inner.read_raw(channel, after, limit, true).await?;
        Ok(Page { position: page.position, messages: page.messages })
    }

    /// `SUBSCRIBE` (`SSUBSCRIBE` on a cluster) and the first position read;
    /// see `fanout.rs`.
    async fn watch(&self, channel: &ChannelName) -> Result<(), EngineError> {
        fanout::watch(&self.inner, channel).await
    }

    async fn unwatch(&self, channel: &ChannelName) {
        fanout::unwatch(&self.inner, channel).await
    }
}

#[async_trait]
impl Cursors for RedisEngine {
    /// One script (compare-and-raise, refusing seqs beyond the head); the
    /// first ack of a subscriber on a channel writes its user-index entry
    /// first. Durability is Redis's `appendfsync` (see docs/guarantees.md).
    async fn cursor_ack(&self, ack: CursorAck) -> Result<CursorState, AckError> {
        self.inner.cursor_ack(ack).await
    }

    async fn cursor(
        &self,
        channel: &ChannelName,
        subscriber: &SubscriberId,
    ) -> Result<Option<CursorState>, EngineError> {
        self.inner.cursor(channel, subscriber).await
    }

    /// In `HSCAN` order.
    async fn cursors(
        &self,
        channel: &ChannelName,
        limit: usize,
    ) -> Result<Vec<(SubscriberId, CursorState)>, EngineError> {
        self.inner.cursors(channel, limit).await
    }

    /// Grouped by subscriber key, then by channel (the index is sorted).
    async fn user_cursors(&self, user: &str, limit: usize) -> Result<Vec<UserCursor>, EngineError> {
        self.inner.user_cursors(user, limit).await
    }
}

#[async_trait]
impl Presence for RedisEngine {
    /// Three round trips (see `presence.rs`).
    async fn lease_join(&self, join: LeaseJoin) -> Result<Joined, EngineError> {
        self.inner.lease_join(join).await
    }

    async fn lease_renew(&self, renew: LeaseRenew) -> Result<Renewed, EngineError> {
        self.inner.lease_renew(renew).await
    }

    async fn lease_leave(&self, leave: LeaseLeave) -> Result<Option<Lease>, EngineError> {
        self.inner.lease_leave(leave).await
    }

    /// Three round trips, indexed like a join.
    async fn lease_rejoin(&self, rejoin: LeaseRejoin) -> Result<Rejoined, EngineError> {
        self.inner.lease_rejoin(rejoin).await
    }

    async fn presence(&self, channel: &ChannelName, limit: usize) -> Result<Vec<Lease>, EngineError> {
        self.inner.presence(channel, limit).await
    }

    async fn presence_count(&self, channel: &ChannelName) -> Result<u64, EngineError> {
        self.inner.presence_count(channel).await
    }

    async fn presence_has_user(&self, channel: &ChannelName, user: &str) -> Result<bool, EngineError> {
        self.inner.presence_has_user(channel, user).await
    }

    async fn presence_expire(&self, limit: usize) -> Result<Vec<(ChannelName, Lease)>, EngineError> {
        self.inner.presence_expire(limit).await
    }
}

#[async_trait]
impl Rooms for RedisEngine {
    async fn room(&self, channel: &ChannelName) -> Result<Option<Room>, EngineError> {
        self.inner.room(channel).await
    }

    async fn room_write(&self, write: RoomWrite) -> Result<RoomWritten, EngineError> {
        self.inner.room_write(write).await
    }

    /// Rooms in channel-name (byte) order, each checked against its record.
    async fn rooms_active(
        &self,
        after: Option<&ChannelName>,
        limit: usize,
    ) -> Result<Vec<(ChannelName, Room)>, EngineError> {
        self.inner.rooms_active(after, limit).await
    }
}

#[async_trait]
impl Schedules for RedisEngine {
    async fn schedule(&self, req: ScheduleRequest) -> Result<ScheduleReceipt, EngineError> {
        self.inner.schedule(req).await
    }

    async fn scheduled(&self, channel: &ChannelName, limit: usize) -> Result<Vec<Schedule>, EngineError> {
        self.inner.scheduled(channel, limit).await
    }

    async fn schedule_cancel(&self, id: &str) -> Result<Option<Schedule>, EngineError> {
        self.inner.schedule_cancel(id).await
    }

    async fn schedules_claim(
        &self,
        now: u64,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<Claim>, EngineError> {
        self.inner.schedules_claim(now, limit, lease).await
    }

    async fn schedule_deliver(&self, claim: &Claim, req: AppendRequest) -> Result<Delivered, EngineError> {
        self.inner.schedule_deliver(claim, req).await
    }

    async fn schedule_next(&self) -> Result<Option<u64>, EngineError> {
        self.inner.schedule_next().await
    }

    async fn schedules_pending(&self) -> Result<u64, EngineError> {
        self.inner.schedules_pending().await
    }
}

#[async_trait]
impl herald_core::Ownership for RedisEngine {
    /// One script on the lease's slot (`OWN_CLAIM`), timed by Redis.
    async fn claim(&self, key: &str, holder: &str, ttl: Duration) -> Result<herald_core::Owned, EngineError> {
        let (owner, counter) = self.inner.keys.owner(key);
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let args = OwnClaim { owner, counter, holder, ttl_ms };
        let token = self.inner.redis.run("own_claim", &args).await?.signed("token")?;
        Ok(match u64::try_from(token) {
            Ok(t) => herald_core::Owned::Held(t),
            Err(_) => herald_core::Owned::Busy,
        })
    }

    async fn release(&self, key: &str, holder: &str) -> Result<(), EngineError> {
        let (owner, _) = self.inner.keys.owner(key);
        let args = OwnRelease { owner, holder };
        self.inner.redis.run("own_release", &args).await?.signed("released")?;
        Ok(())
    }
}

/// See `control.rs`.
#[async_trait]
impl Control for RedisEngine {
    fn set_control_sink(&self, sink: Arc<dyn ControlSink>) {
        if self.bus.sink.set(sink).is_err() {
            tracing::warn!("control sink installed twice; the first stays");
        }
    }

    async fn ban(&self, ban: &Ban) -> Result<(), EngineError> {
        self.inner.ban(ban).await
    }

    async fn revoke(&self, user: &str, before_ms: u64) -> Result<u64, EngineError> {
        self.inner.revoke(user, before_ms).await
    }

    async fn admission(
        &self,
        user: &str,
        device: Option<&str>,
        now_ms: u64,
    ) -> Result<Admission, EngineError> {
        self.inner.admission(user, device, now_ms).await
    }

    async fn broadcast(&self, order: bytes::Bytes) -> Result<(), EngineError> {
        self.inner.publish_order(&self.bus.channel, order).await
    }

    async fn node_report(&self, node: &NodeView, lease: Duration) -> Result<(), EngineError> {
        self.inner.node_report(node, lease).await
    }

    async fn node_leave(&self, id: &str) -> Result<(), EngineError> {
        self.inner.node_leave(id).await
    }

    async fn nodes(&self) -> Result<Vec<NodeView>, EngineError> {
        self.inner.nodes().await
    }
}

#[async_trait]
impl Lifecycle for RedisEngine {
    /// Every named counter of [`RedisStats`].
    fn metrics(&self) -> Vec<EngineMetric> {
        self.stats().metrics()
    }

    fn health(&self) -> Health {
        if self.inner.closing.load(Ordering::Acquire) {
            return Health::Unavailable("redis engine is closed".into());
        }
        match self.inner.redis.health.down_reason() {
            Some(reason) => Health::Unavailable(reason),
            None => Health::Ready,
        }
    }

    /// Refuse new appends and acks, stop the background tasks and remove
    /// the lease. Idempotent. Nothing is buffered in the node: every `Ok`
    /// append is in Redis already.
    async fn close(&self) {
        if self.inner.closing.swap(true, Ordering::AcqRel) {
            return;
        }
        let fan = &self.inner.fanout;
        fan.cancel.cancel();
        fan.tasks.close();
        if tokio::time::timeout(CLOSE_WAIT, fan.tasks.wait()).await.is_err() {
            tracing::warn!("redis engine tasks did not stop in time");
        }
        lease::release(&self.inner, &self.lease).await;
        tracing::info!(node_id = %self.node_id, "redis engine closed");
    }
}

impl Drop for RedisEngine {
    fn drop(&mut self) {
        // The background tasks hold the shared state; without a `close`
        // they would keep it (and the connections) alive.
        self.inner.fanout.cancel.cancel();
    }
}
