//! [`EmbeddedEngine`]: the handle the server holds.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use async_trait::async_trait;
use herald_core::{
    AckError, AppendRequest, CursorAck, CursorState, Cursors, EngineError, EngineMetric, Epoch, FanoutSink,
    Health, Joined, Lease, LeaseJoin, LeaseLeave, LeaseRejoin, LeaseRenew, Lifecycle, Log, Page, Position,
    Presence, Receipt, Rejoined, Renewed, Room, RoomWrite, RoomWritten, Rooms, Seq, SubscriberId, UserCursor,
};
use herald_core::{Admission, Ban, Control, ControlSink, NodeView};
use herald_core::{Claim, Delivered, Schedule, ScheduleReceipt, ScheduleRequest, Schedules};
use herald_proto::ChannelName;
use tokio::sync::{mpsc, oneshot};

use crate::append::AppendBatch;
use crate::request::Request;
use crate::schedules::{self, Cancel, Deliver};
use crate::shared::Shared;
use crate::stage::{Outcome, Req, Stage};
use crate::storage::{Storage, StorageError};
use crate::writer::Writer;
use crate::{presence, read};
use crate::{StoreConfig, StoreError, StoreStats};

/// The embedded (single-node) engine. See the crate docs.
///
/// Prefer `close().await` before dropping it: dropping without `close`
/// still finishes and persists the queued appends, but blocks the dropping
/// thread until the writer thread has exited.
pub struct EmbeddedEngine {
    shared: Arc<Shared>,
    /// `None` only inside `Drop`, which drops it to stop the writer.
    tx: Option<mpsc::Sender<Request>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    queue_capacity: usize,
    data_dir: PathBuf,
    /// Where [`Control::broadcast`] hands orders: this node is the only one.
    control_sink: std::sync::OnceLock<Arc<dyn ControlSink>>,
    /// This node's entry ([`Control::node_report`]) and when its lease ends
    /// (ms). Not stored: a restarted node reports itself again.
    node: Mutex<Option<(NodeView, u64)>>,
}

impl EmbeddedEngine {
    /// Open (or create) the store in `config.data_dir` and start its writer
    /// thread. Fails with [`StoreError::Locked`] when another engine, in this
    /// process or another, has the data dir open.
    ///
    /// Blocking (recovers the journal); call it before serving, or from
    /// `spawn_blocking`.
    pub fn open(config: StoreConfig) -> Result<Self, StoreError> {
        config.validate()?;
        let storage = Storage::open(&config.data_dir)?;
        let shared = Arc::new(Shared::new(storage));
        let pending = schedules::count(&shared.storage).map_err(|e| StoreError::Storage(e.to_string()))?;
        shared.add_schedules_pending(i64::try_from(pending).unwrap_or(i64::MAX));
        let (tx, rx) = mpsc::channel(config.queue_capacity);
        // A private current-thread runtime, owned by the writer thread, only
        // for its timed wait on the queue.
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_time().build().map_err(StoreError::Spawn)?;
        let writer = Writer::new(shared.clone(), rx, &config);
        let handle = std::thread::Builder::new()
            .name("herald-store-writer".into())
            .spawn(move || writer.run(rt))
            .map_err(StoreError::Spawn)?;
        tracing::info!(
            data_dir = %config.data_dir.display(),
            epoch = %shared.storage.epoch(),
            fsync = %config.fsync,
            "embedded store open"
        );
        Ok(Self {
            shared,
            tx: Some(tx),
            writer: Mutex::new(Some(handle)),
            queue_capacity: config.queue_capacity,
            data_dir: config.data_dir,
            control_sink: std::sync::OnceLock::new(),
            node: Mutex::new(None),
        })
    }

    /// The epoch of this data dir (every channel shares it).
    pub fn epoch(&self) -> Epoch {
        self.shared.storage.epoch().clone()
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The engine's counters, for metrics.
    pub fn stats(&self) -> StoreStats {
        let free = self.tx.as_ref().map_or(self.queue_capacity, mpsc::Sender::capacity);
        let depth = self.queue_capacity.saturating_sub(free);
        self.shared.counters.snapshot(u64::try_from(depth).unwrap_or(u64::MAX))
    }

    /// Test hook: make the next storage commit fail as an I/O error would,
    /// which puts the engine into fail-stop.
    #[doc(hidden)]
    pub fn inject_failure(&self) {
        self.shared.storage.inject_commit_failure();
    }

    /// A storage error on the read path is a storage error like any other:
    /// fail-stop (STYLE: an I/O error makes the engine refuse writes).
    fn read_failed(&self, e: StorageError) -> EngineError {
        EngineError::Failed(self.shared.fail(format!("read failed: {e}")))
    }

    /// Queue a write for the writer and wait for its outcome.
    async fn submit<K: Stage>(&self, write: K) -> Result<Outcome<K>, EngineError>
    where
        Request: From<Req<K>>,
    {
        let (reply_tx, reply_rx) = oneshot::channel();
        self.enqueue(Req::new(write, reply_tx).into()).await?;
        reply_rx.await.map_err(|_| self.shared.stopped_error())
    }

    /// Queue a request for the writer (the reply travels in it).
    async fn enqueue(&self, request: Request) -> Result<(), EngineError> {
        if let Some(reason) = self.shared.failure() {
            self.shared.counters.failed.bump();
            return Err(EngineError::Failed(reason.to_owned()));
        }
        if self.shared.is_closing() {
            return Err(EngineError::ShuttingDown);
        }
        let tx = self.tx.as_ref().ok_or(EngineError::ShuttingDown)?;
        // Waits while the queue is full: that is the engine's backpressure.
        // If this future is dropped after the send, the request still runs.
        tx.send(request).await.map_err(|_| self.shared.stopped_error())
    }

    /// Run a read on the blocking pool (range scans may touch disk, too
    /// long to hold a runtime worker); storage errors fail-stop.
    async fn read_blocking<T: Send + 'static>(
        &self,
        read: impl FnOnce(&crate::storage::Storage) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, EngineError> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || read(&shared.storage))
            .await
            .map_err(|e| EngineError::Failed(format!("read task failed: {e}")))?
            .map_err(|e| self.read_failed(e))
    }
}

#[async_trait]
impl Log for EmbeddedEngine {
    fn set_sink(&self, sink: Arc<dyn FanoutSink>) {
        self.shared.set_sink(sink);
    }

    async fn append(&self, req: AppendRequest) -> Result<Receipt, EngineError> {
        self.submit(req).await?
    }

    /// One queue hand-off for the whole batch: the writer stages its
    /// requests one after the other into one group commit (one fsync).
    async fn append_batch(&self, reqs: Vec<AppendRequest>) -> Vec<Result<Receipt, EngineError>> {
        match reqs.len() {
            0 => return Vec::new(),
            1 => return vec![self.append(reqs.into_iter().next().expect("one request")).await],
            _ => {}
        }
        let n = reqs.len();
        // A failed batch is one `Failed` for all of them.
        match self.submit(AppendBatch(reqs)).await.and_then(|outcome| outcome) {
            Ok(results) => results,
            Err(e) => (0..n).map(|_| Err(e.clone())).collect(),
        }
    }

    /// Runs inline: one point read of the channel meta, served from the
    /// memtable or block cache (a few µs, see the `append_bench` example's
    /// read figures), which is cheaper than a hop to the blocking pool.
    async fn position(&self, channel: &ChannelName) -> Result<Position, EngineError> {
        read::position(&self.shared.storage, channel).map_err(|e| self.read_failed(e))
    }

    /// Runs on the blocking pool: a page is a range scan of up to `limit`
    /// entries that may touch disk, too long to hold a runtime worker.
    async fn read(&self, channel: &ChannelName, after: Seq, limit: usize) -> Result<Page, EngineError> {
        let channel = channel.clone();
        self.read_blocking(move |storage| read::read_page(storage, &channel, after, limit)).await
    }
}

#[async_trait]
impl Cursors for EmbeddedEngine {
    /// Goes through the writer and its group commit, like an append, but
    /// never costs an fsync of its own: with `FsyncMode::Always` a batch of
    /// acks only is written to the OS (so an `Ok` ack survives `kill -9`)
    /// and fsynced within `StoreConfig::ack_sync_interval`; with
    /// `FsyncMode::Never` it is never fsynced before a clean close.
    async fn cursor_ack(&self, ack: CursorAck) -> Result<CursorState, AckError> {
        self.submit(ack).await?
    }

    /// Runs inline: one point read, like `position`.
    async fn cursor(
        &self,
        channel: &ChannelName,
        subscriber: &SubscriberId,
    ) -> Result<Option<CursorState>, EngineError> {
        read::cursor(&self.shared.storage, channel, subscriber).map_err(|e| self.read_failed(e))
    }

    /// In subscriber-key order (`SubscriberId::key`), on the blocking pool.
    async fn cursors(
        &self,
        channel: &ChannelName,
        limit: usize,
    ) -> Result<Vec<(SubscriberId, CursorState)>, EngineError> {
        let channel = channel.clone();
        self.read_blocking(move |storage| read::cursors(storage, &channel, limit)).await
    }

    /// Grouped by subscriber key (the user without a device first), then
    /// by channel; on the blocking pool.
    async fn user_cursors(&self, user: &str, limit: usize) -> Result<Vec<UserCursor>, EngineError> {
        let user = user.to_owned();
        self.read_blocking(move |storage| read::user_cursors(storage, &user, limit)).await
    }
}

#[async_trait]
impl Presence for EmbeddedEngine {
    /// Through the writer, like an ack: no fsync of its own (see
    /// `presence.rs`). Refused with [`EngineError::Closed`] on a closed
    /// channel: a closed room has no members.
    async fn lease_join(&self, join: LeaseJoin) -> Result<Joined, EngineError> {
        self.submit(join).await?
    }

    /// Through the writer; no fsync of its own. Extends an expired lease
    /// that no `presence_expire` removed yet (its `leave` was not
    /// announced, so the member never left).
    async fn lease_renew(&self, renew: LeaseRenew) -> Result<Renewed, EngineError> {
        self.submit(renew).await?
    }

    /// Through the writer; no fsync of its own.
    async fn lease_leave(&self, leave: LeaseLeave) -> Result<Option<Lease>, EngineError> {
        self.submit(leave).await?
    }

    /// Through the writer, like a join; no fsync of its own. Removals are
    /// remembered in memory (`gone.rs`): tokens live only in this
    /// process's sessions, so a restart forgets nothing a holder could use.
    async fn lease_rejoin(&self, rejoin: LeaseRejoin) -> Result<Rejoined, EngineError> {
        self.submit(rejoin).await?
    }

    /// On the blocking pool: a scan of the channel's leases.
    async fn presence(&self, channel: &ChannelName, limit: usize) -> Result<Vec<Lease>, EngineError> {
        let (channel, now) = (channel.clone(), self.shared.clock.now_ms());
        self.read_blocking(move |storage| read::presence(storage, &channel, limit, now)).await
    }

    /// On the blocking pool: a scan of the channel's lease headers.
    async fn presence_count(&self, channel: &ChannelName) -> Result<u64, EngineError> {
        let (channel, now) = (channel.clone(), self.shared.clock.now_ms());
        self.read_blocking(move |storage| read::presence_count(storage, &channel, now)).await
    }

    /// Runs inline: a scan of one user's leases on the channel (a few
    /// client ids), like a point read.
    async fn presence_has_user(&self, channel: &ChannelName, user: &str) -> Result<bool, EngineError> {
        let now = self.shared.clock.now_ms();
        read::presence_has_user(&self.shared.storage, channel, user, now).map_err(|e| self.read_failed(e))
    }

    /// Through the writer (removal and handing out are one step, so each
    /// lease goes to one caller), oldest expiry first; no fsync of its own.
    async fn presence_expire(&self, limit: usize) -> Result<Vec<(ChannelName, Lease)>, EngineError> {
        self.submit(presence::Expire { limit }).await?
    }
}

#[async_trait]
impl Rooms for EmbeddedEngine {
    /// Runs inline: one point read.
    async fn room(&self, channel: &ChannelName) -> Result<Option<Room>, EngineError> {
        read::room(&self.shared.storage, channel).map_err(|e| self.read_failed(e))
    }

    /// Through the writer, in the group commit of the appends around it,
    /// with their fsync. The event is always staged durable, closing
    /// exactly when the new state is closed, and without dedup (see
    /// `rooms.rs`).
    async fn room_write(&self, write: RoomWrite) -> Result<RoomWritten, EngineError> {
        self.submit(write).await?
    }

    /// On the blocking pool: a scan of the active-room index.
    async fn rooms_active(
        &self,
        after: Option<&ChannelName>,
        limit: usize,
    ) -> Result<Vec<(ChannelName, Room)>, EngineError> {
        let after = after.cloned();
        self.read_blocking(move |storage| read::rooms_active(storage, after.as_ref(), limit)).await
    }
}

#[async_trait]
impl Schedules for EmbeddedEngine {
    /// Through the writer, in the group commit of the appends around it,
    /// with their fsync.
    async fn schedule(&self, req: ScheduleRequest) -> Result<ScheduleReceipt, EngineError> {
        self.submit(req).await?
    }

    /// On the blocking pool: a scan of the channel's index.
    async fn scheduled(&self, channel: &ChannelName, limit: usize) -> Result<Vec<Schedule>, EngineError> {
        let channel = channel.clone();
        self.read_blocking(move |storage| schedules::by_channel(storage, &channel, limit)).await
    }

    async fn schedule_cancel(&self, id: &str) -> Result<Option<Schedule>, EngineError> {
        let id: Arc<str> = Arc::from(id);
        let found = self.submit(Cancel { id: id.clone() }).await??;
        self.shared.claims.forget(&id);
        Ok(found)
    }

    /// Claims live in this process (see `schedules.rs`); the scan skips
    /// schedules under an unexpired claim.
    async fn schedules_claim(
        &self,
        now: u64,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<Claim>, EngineError> {
        let shared = self.shared.clone();
        let due = self
            .read_blocking(move |storage| {
                schedules::due(storage, &shared.due_floor, now, limit, |id| {
                    shared.claims.held(id, shared.clock.now_ms())
                })
            })
            .await?;
        let at = self.shared.clock.now_ms();
        Ok(due.into_iter().filter_map(|s| self.shared.claims.claim(s, at, lease)).collect())
    }

    /// The token check here refuses a claim known to be stale; the writer's
    /// check that the schedule is still stored, in the commit that appends
    /// and removes it, is what makes delivery happen once.
    async fn schedule_deliver(&self, claim: &Claim, req: AppendRequest) -> Result<Delivered, EngineError> {
        if !self.shared.claims.current(claim) {
            return Ok(Delivered::Stale);
        }
        let id = claim.schedule.id.clone();
        let r = self.submit(Deliver { id, req }).await?;
        if r.is_ok() {
            self.shared.claims.forget(&claim.schedule.id);
        }
        r
    }

    async fn schedule_next(&self) -> Result<Option<u64>, EngineError> {
        let shared = self.shared.clone();
        self.read_blocking(move |storage| schedules::next(storage, &shared.due_floor)).await
    }

    async fn schedules_pending(&self) -> Result<u64, EngineError> {
        Ok(self.shared.schedules_pending())
    }
}

impl herald_core::Ownership for EmbeddedEngine {}

/// One node: the control channel is a call of this node's sink; bans and
/// revocations are stored (`control.rs`) through the writer, with an fsync.
#[async_trait]
impl Control for EmbeddedEngine {
    fn set_control_sink(&self, sink: Arc<dyn ControlSink>) {
        let _ = self.control_sink.set(sink);
    }

    async fn ban(&self, ban: &Ban) -> Result<(), EngineError> {
        let key = crate::control::ban_key(&ban.user, ban.device.as_deref());
        self.submit(crate::control::Raise { key, at_ms: ban.until_ms }).await??;
        Ok(())
    }

    async fn revoke(&self, user: &str, before_ms: u64) -> Result<u64, EngineError> {
        self.submit(crate::control::Raise { key: crate::control::revoke_key(user), at_ms: before_ms }).await?
    }

    /// Runs inline: two or three point reads.
    async fn admission(
        &self,
        user: &str,
        device: Option<&str>,
        now_ms: u64,
    ) -> Result<Admission, EngineError> {
        crate::control::admission(&self.shared.storage, user, device, now_ms).map_err(|e| self.read_failed(e))
    }

    async fn broadcast(&self, order: bytes::Bytes) -> Result<(), EngineError> {
        if let Some(sink) = self.control_sink.get() {
            sink.order(order);
        }
        Ok(())
    }

    async fn node_report(&self, node: &NodeView, lease: Duration) -> Result<(), EngineError> {
        let until = self.shared.clock.now_ms().saturating_add(lease.as_millis() as u64);
        *self.node.lock().expect("node lock poisoned") = Some((node.clone(), until));
        Ok(())
    }

    async fn node_leave(&self, id: &str) -> Result<(), EngineError> {
        let mut node = self.node.lock().expect("node lock poisoned");
        if node.as_ref().is_some_and(|(n, _)| n.id == id) {
            *node = None;
        }
        Ok(())
    }

    async fn nodes(&self) -> Result<Vec<NodeView>, EngineError> {
        let now = self.shared.clock.now_ms();
        let node = self.node.lock().expect("node lock poisoned");
        Ok(node.iter().filter(|(_, until)| *until > now).map(|(n, _)| n.clone()).collect())
    }
}

#[async_trait]
impl Lifecycle for EmbeddedEngine {
    /// Every named counter of [`StoreStats`], and the queue depth.
    fn metrics(&self) -> Vec<EngineMetric> {
        self.stats().metrics()
    }

    fn health(&self) -> Health {
        if let Some(reason) = self.shared.failure() {
            Health::Failed(reason.to_owned())
        } else if self.shared.is_closing() {
            Health::Unavailable("embedded store is closed".into())
        } else {
            Health::Ready
        }
    }

    /// Refuse new appends, let the writer finish the queued ones, persist,
    /// and join the writer thread. Idempotent. The data dir stays locked
    /// until the engine is dropped (reads keep working until then).
    async fn close(&self) {
        self.shared.begin_close();
        if let Some(tx) = &self.tx {
            // Fails only if the writer already stopped taking requests.
            let _ = tx.send(Request::Close).await;
        }
        self.shared.writer_finished().await;
        let handle = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(handle) = handle {
            // The writer has signalled it is done; joining only waits for
            // the thread to unwind, but is still a blocking call.
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
        }
    }
}

impl Drop for EmbeddedEngine {
    fn drop(&mut self) {
        // Dropping the only sender ends the writer's loop after it has
        // processed everything queued.
        self.tx.take();
        let handle = self.writer.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(handle) = handle {
            if handle.join().is_err() {
                tracing::error!("embedded store writer thread panicked");
            }
        }
    }
}
