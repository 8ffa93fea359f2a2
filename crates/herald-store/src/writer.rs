//! The writer thread: the only code that mutates the store. This file is
//! the batch loop; what each request stages is beside it.
//!
//! It takes every queued request (up to `max_batch`), stages them into one
//! [`WriteSet`] (appends: closed check, dedup check, seq assignment, frame
//! encoding, trimming, receipt, see `append.rs`; acks: compare-and-raise of a cursor, see
//! `cursors.rs`; presence: lease changes with fencing tokens, see
//! `presence.rs`; rooms: compare-and-set plus the event's append, see
//! `rooms.rs`), commits that set atomically, then answers every request,
//! then fans the new messages out in seq order. Between batches it runs
//! bounded slices of the retention sweep (`sweep.rs`) and, when due, the
//! fsync of acks and presence writes that have not had one yet.
//!
//! Requests of one batch see each other: each is staged against the
//! committed state overlaid with what the batch staged before it
//! ([`WriteSet::staged`], the channel cache, the cursor book), so the batch
//! behaves exactly as if its requests had committed one by one, in queue
//! order.
//!
//! With [`FsyncMode::Always`] a batch that appended anything (room writes
//! included) is committed with one fsync (its acks and presence writes ride
//! along); a batch of acks and presence writes only is committed without one
//! (written to the OS, so it survives a crash of the process) and is fsynced
//! within `ack_sync_interval` by a later append batch, a sweep, or the
//! ack-sync timer, whichever comes first.
//!
//! Invariants:
//! - one thread owns `channels` (the head/first cache); after every
//!   successful commit the cache equals the committed state, so it can be
//!   dropped and reloaded at any time;
//! - no request is answered `Ok` before the commit carrying its writes
//!   succeeded; a failed commit answers the whole batch `Failed` and puts the
//!   engine into fail-stop (nothing is retried: after an fsync error the
//!   state of the journal is unknown);
//! - fan-out happens only for committed, non-duplicate appends, in the order
//!   they were staged, which is seq order per channel.

use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_core::{
    AckError, AppendRequest, CursorState, EngineError, Message, Receipt, RoomWrite, RoomWritten, Seq,
    SubscriberId,
};
use herald_proto::ChannelName;
use tokio::sync::{mpsc, oneshot};

use crate::codec::{ChannelMeta, IdemRecord};
use crate::cursors::CursorBook;
use crate::presence::{PresenceCmd, PresenceDone};
use crate::schedules::{SchedCmd, SchedDone};
use crate::shared::Shared;
use crate::stats::bump;
pub(crate) use crate::stats::Tally;
use crate::storage::{Space, StorageError, WriteSet};
use crate::sweep::SweepState;
use crate::FsyncMode;

/// Channels whose head/first the writer keeps in memory; past this the
/// cache is dropped after a batch and reloaded on demand (it only saves a
/// point read per batch and channel).
const CHANNEL_CACHE_CAP: usize = 65_536;

pub(crate) type AppendReply = oneshot::Sender<Result<Receipt, EngineError>>;
/// The results of an [`Command::AppendBatch`], in its order, sent together.
pub(crate) type BatchReply = oneshot::Sender<Vec<Result<Receipt, EngineError>>>;
pub(crate) type AckReply = oneshot::Sender<Result<CursorState, AckError>>;
pub(crate) type RoomReply = oneshot::Sender<Result<RoomWritten, EngineError>>;

pub(crate) enum Command {
    Append {
        req: AppendRequest,
        reply: AppendReply,
    },
    /// Several appends of one caller, in order: one queue hand-off, staged
    /// one after the other into the same group commit (the batch may then
    /// exceed `max_batch` by this command's length), answered with one
    /// reply (one wake-up of the caller).
    AppendBatch(Vec<AppendRequest>, BatchReply),
    Ack {
        req: AckRequest,
        reply: AckReply,
    },
    Presence(PresenceCmd),
    Room {
        write: RoomWrite,
        reply: RoomReply,
    },
    Sched(SchedCmd),
    /// Stop accepting, finish what is queued, persist, exit.
    Close,
}

/// `Cursors::ack`'s arguments.
pub(crate) struct AckRequest {
    pub channel: ChannelName,
    pub subscriber: SubscriberId,
    pub seq: Seq,
}

/// A request taken from the queue for the next group commit.
pub(crate) enum Op {
    Append(AppendRequest, AppendReply),
    AppendBatch(Vec<AppendRequest>, BatchReply),
    Ack(AckRequest, AckReply),
    Presence(PresenceCmd),
    Room(RoomWrite, RoomReply),
    Sched(SchedCmd),
}

impl Op {
    /// How many requests the op carries (a group commit takes up to
    /// `max_batch` of them, and at least one op).
    fn requests(&self) -> usize {
        match self {
            Op::AppendBatch(reqs, _) => reqs.len(),
            _ => 1,
        }
    }

    fn fail(self, reason: &str) {
        // A dropped receiver is a caller that stopped waiting.
        match self {
            Op::Append(_, reply) => {
                let _ = reply.send(Err(EngineError::Failed(reason.to_owned())));
            }
            Op::AppendBatch(reqs, reply) => {
                let _ = reply.send(failed_all(reqs.len(), reason));
            }
            Op::Ack(_, reply) => {
                let _ = reply.send(Err(EngineError::Failed(reason.to_owned()).into()));
            }
            Op::Presence(cmd) => cmd.unstaged().fail(reason),
            Op::Room(_, reply) => {
                let _ = reply.send(Err(EngineError::Failed(reason.to_owned())));
            }
            Op::Sched(cmd) => cmd.unstaged().fail(reason),
        }
    }
}

/// A staged request: what its caller is told once the batch committed.
enum Staged {
    Append { reply: AppendReply, result: Result<Receipt, EngineError>, fanout: Option<Arc<Message>> },
    AppendBatch { reply: BatchReply, results: Vec<Result<Receipt, EngineError>>, fanout: Vec<Arc<Message>> },
    Ack { reply: AckReply, result: Result<CursorState, AckError> },
    Presence(PresenceDone),
    Room { reply: RoomReply, result: Result<RoomWritten, EngineError>, fanout: Option<Arc<Message>> },
    Sched(SchedDone),
}

impl Staged {
    /// A request left unstaged after a storage error; the placeholder
    /// result is never sent (the whole batch is answered `Failed`).
    fn unstaged(op: Op) -> Self {
        match op {
            Op::Append(_, reply) => {
                Staged::Append { reply, result: Err(EngineError::ShuttingDown), fanout: None }
            }
            Op::AppendBatch(reqs, reply) => Staged::AppendBatch {
                reply,
                results: reqs.iter().map(|_| Err(EngineError::ShuttingDown)).collect(),
                fanout: Vec::new(),
            },
            Op::Ack(_, reply) => Staged::Ack { reply, result: Err(EngineError::ShuttingDown.into()) },
            Op::Presence(cmd) => Staged::Presence(cmd.unstaged()),
            Op::Room(_, reply) => {
                Staged::Room { reply, result: Err(EngineError::ShuttingDown), fanout: None }
            }
            Op::Sched(cmd) => Staged::Sched(cmd.unstaged()),
        }
    }

    fn fail(self, reason: &str) {
        match self {
            Staged::Append { reply, .. } => {
                let _ = reply.send(Err(EngineError::Failed(reason.to_owned())));
            }
            Staged::AppendBatch { reply, results, .. } => {
                let _ = reply.send(failed_all(results.len(), reason));
            }
            Staged::Ack { reply, .. } => {
                let _ = reply.send(Err(EngineError::Failed(reason.to_owned()).into()));
            }
            Staged::Presence(done) => done.fail(reason),
            Staged::Room { reply, .. } => {
                let _ = reply.send(Err(EngineError::Failed(reason.to_owned())));
            }
            Staged::Sched(done) => done.fail(reason),
        }
    }

    /// Answer the caller; keep the message to fan out, if any.
    fn answer(self, fanout: &mut Vec<Arc<Message>>) {
        // A dropped receiver is a caller that stopped waiting; the write
        // stands (like a publish whose client disconnected).
        match self {
            Staged::Append { reply, result, fanout: msg } => {
                let _ = reply.send(result);
                fanout.extend(msg);
            }
            Staged::AppendBatch { reply, results, fanout: msgs } => {
                let _ = reply.send(results);
                fanout.extend(msgs);
            }
            Staged::Ack { reply, result } => {
                let _ = reply.send(result);
            }
            Staged::Presence(done) => done.answer(),
            Staged::Room { reply, result, fanout: msg } => {
                let _ = reply.send(result);
                fanout.extend(msg);
            }
            Staged::Sched(done) => done.answer(fanout),
        }
    }
}

/// The group commit being built by [`Writer::process`].
struct Staging {
    ws: WriteSet,
    pending_idem: PendingIdem,
    tally: Tally,
    /// Whether an append, room write or schedule wrote anything: only then
    /// does the commit need an fsync under `FsyncMode::Always` (acks and
    /// presence writes alone never do).
    appended: bool,
    /// After a storage error the rest is not staged; every result of the
    /// batch is then replaced by `Failed`.
    storage_error: Option<StorageError>,
}

impl Staging {
    fn new(requests: usize) -> Self {
        Self {
            // An append stages up to four keys (log entry, channel meta,
            // receipt and its expiry entry); the meta is shared by a
            // channel's appends.
            ws: WriteSet::with_capacity(requests * 3),
            pending_idem: PendingIdem::with_capacity_and_hasher(requests, Default::default()),
            tally: Tally::default(),
            appended: false,
            storage_error: None,
        }
    }

    /// Stage one write that may fan a message out (an append, a room
    /// write): its result and the message to fan out once committed. Every
    /// such write that writes puts a key no other request of the batch
    /// wrote (a new log entry or receipt), so a longer write set means it
    /// wrote.
    fn write<T>(
        &mut self,
        stage: impl FnOnce(
            &mut WriteSet,
            &mut PendingIdem,
            &mut Tally,
        ) -> Result<(T, Option<Arc<Message>>), StageError>,
    ) -> (Result<T, EngineError>, Option<Arc<Message>>) {
        let before = self.ws.len();
        let result = stage(&mut self.ws, &mut self.pending_idem, &mut self.tally);
        self.appended |= self.ws.len() > before;
        match result {
            Ok((written, fanout)) => (Ok(written), fanout),
            Err(StageError::Refused(e)) => (Err(e), None),
            Err(StageError::Storage(e)) => {
                self.storage_error = Some(e);
                (Err(EngineError::ShuttingDown), None)
            }
        }
    }
}

/// `n` results failed with the engine's failure `reason`.
fn failed_all(n: usize, reason: &str) -> Vec<Result<Receipt, EngineError>> {
    (0..n).map(|_| Err(EngineError::Failed(reason.to_owned()))).collect()
}

/// Why staging one request did not produce an append.
pub(crate) enum StageError {
    /// Answer this request with the error; the batch goes on.
    Refused(EngineError),
    /// Storage failed: the whole batch fails and the engine fail-stops.
    Storage(StorageError),
}

impl From<StorageError> for StageError {
    fn from(e: StorageError) -> Self {
        Self::Storage(e)
    }
}

/// Receipts staged by the batch being built, by idempotency key: a retry
/// inside one batch finds the first one's receipt before it is committed.
pub(crate) type PendingIdem = foldhash::HashMap<Arc<str>, IdemRecord>;

pub(crate) struct Writer {
    pub(crate) shared: Arc<Shared>,
    rx: mpsc::Receiver<Command>,
    pub(crate) fsync: FsyncMode,
    max_batch: usize,
    pub(crate) sweep_interval: Duration,
    /// Longest an ack or presence write committed without fsync waits for
    /// one (`FsyncMode::Always` only).
    ack_sync_interval: Duration,
    /// Since when committed writes (acks, presence) wait for an fsync;
    /// `None` when everything committed has been fsynced (or
    /// `FsyncMode::Never`).
    unsynced_since: Option<Instant>,
    pub(crate) channels: foldhash::HashMap<ChannelName, ChannelMeta>,
    /// Channels whose cached meta the batch being built changed: their meta
    /// is staged once, when the batch is complete (see [`Self::stage_metas`]).
    pub(crate) dirty_metas: foldhash::HashSet<ChannelName>,
    pub(crate) cursors: CursorBook,
    pub(crate) sweep: SweepState,
    /// Removed leases, for rejoins (`gone.rs`).
    pub(crate) gone: crate::gone::GoneBook,
}

impl Writer {
    pub fn new(shared: Arc<Shared>, rx: mpsc::Receiver<Command>, config: &crate::StoreConfig) -> Self {
        let sweep_interval = config.sweep_interval;
        Self {
            shared,
            rx,
            fsync: config.fsync,
            max_batch: config.max_batch,
            sweep_interval,
            ack_sync_interval: config.ack_sync_interval,
            unsynced_since: None,
            channels: foldhash::HashMap::default(),
            dirty_metas: foldhash::HashSet::default(),
            cursors: CursorBook::default(),
            sweep: SweepState::new(Instant::now() + sweep_interval),
            gone: Default::default(),
        }
    }

    /// The thread's body. `rt` only drives the timed wait for the next
    /// request (a current-thread runtime with a timer, owned by this thread).
    pub fn run(mut self, rt: tokio::runtime::Runtime) {
        let shared = self.shared.clone();
        // Marks the writer done on every exit path, also on a panic, so
        // `close` never waits forever.
        let _done = DoneGuard(shared);
        let mut batch = Vec::with_capacity(self.max_batch);
        loop {
            let first = match self.rx.try_recv() {
                Ok(cmd) => Some(cmd),
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) => {
                    let deadline = tokio::time::Instant::from_std(self.next_wakeup());
                    // The timer must be created inside `block_on` (it needs the
                    // runtime's time driver in context).
                    let rx = &mut self.rx;
                    match rt.block_on(async { tokio::time::timeout_at(deadline, rx.recv()).await }) {
                        Ok(Some(cmd)) => Some(cmd),
                        // Every sender is gone: the engine was dropped.
                        Ok(None) => break,
                        Err(_elapsed) => None,
                    }
                }
            };
            let mut closing = false;
            if let Some(cmd) = first {
                closing |= collect(cmd, &mut batch);
                let mut requests = requests_in(&batch);
                while requests < self.max_batch && !closing {
                    match self.rx.try_recv() {
                        Ok(cmd) => {
                            let before = batch.len();
                            closing |= collect(cmd, &mut batch);
                            requests += requests_in(&batch[before..]);
                        }
                        Err(_) => break,
                    }
                }
            }
            self.process(&mut batch);
            if closing {
                // Refuse new sends, then finish everything already queued:
                // those requests were accepted before the close.
                self.rx.close();
                while let Ok(cmd) = self.rx.try_recv() {
                    collect(cmd, &mut batch);
                    if requests_in(&batch) >= self.max_batch {
                        self.process(&mut batch);
                    }
                }
                self.process(&mut batch);
                break;
            }
            if Instant::now() >= self.sweep.next_at {
                self.sweep_step();
            }
            if self.ack_sync_due().is_some_and(|due| Instant::now() >= due) {
                self.sync_acks();
            }
        }
        self.finish();
    }

    /// When the loop must wake up without a request: the next sweep slice
    /// or the ack fsync, whichever is first.
    fn next_wakeup(&self) -> Instant {
        match self.ack_sync_due() {
            Some(due) => due.min(self.sweep.next_at),
            None => self.sweep.next_at,
        }
    }

    /// When the acks committed without fsync must be fsynced.
    fn ack_sync_due(&self) -> Option<Instant> {
        self.unsynced_since.map(|since| since + self.ack_sync_interval)
    }

    /// Fsync the acks committed without one (the ack-sync timer).
    fn sync_acks(&mut self) {
        if self.shared.failure().is_some() {
            self.unsynced_since = None;
            return;
        }
        match self.shared.storage.sync() {
            Ok(()) => {
                bump(&self.shared.counters.fsyncs, 1);
                self.unsynced_since = None;
            }
            Err(e) => {
                self.unsynced_since = None;
                self.shared.fail(format!("ack fsync failed: {e}"));
            }
        }
    }

    /// Commit `ws` atomically, with an fsync if `sync`, and keep the fsync
    /// bookkeeping: an fsync covers everything committed before it (one
    /// journal, written in order), so it also settles waiting acks.
    pub(crate) fn commit(&mut self, ws: WriteSet, sync: bool) -> Result<(), StorageError> {
        let wrote = !ws.is_empty();
        self.shared.storage.commit(ws, sync)?;
        if wrote && sync {
            bump(&self.shared.counters.fsyncs, 1);
            self.unsynced_since = None;
        } else if wrote && self.fsync == FsyncMode::Always {
            self.unsynced_since.get_or_insert_with(Instant::now);
        }
        Ok(())
    }

    /// Persist everything before the thread exits (also with
    /// `FsyncMode::Never`: a clean shutdown loses nothing).
    fn finish(&mut self) {
        if self.shared.failure().is_some() {
            return;
        }
        match self.shared.storage.sync() {
            Ok(()) => bump(&self.shared.counters.fsyncs, 1),
            Err(e) => {
                self.shared.fail(format!("final sync failed: {e}"));
            }
        }
    }

    /// One group commit: stage every request, commit once, answer, fan out.
    fn process(&mut self, batch: &mut Vec<Op>) {
        if batch.is_empty() {
            return;
        }
        let shared = self.shared.clone();
        let counters = &shared.counters;
        let requests = requests_in(batch);
        let n = requests as u64;
        if let Some(reason) = self.shared.failure() {
            let reason = reason.to_owned();
            // Counted before answering, so a caller that saw the error sees it counted.
            bump(&counters.failed, n);
            for op in batch.drain(..) {
                op.fail(&reason);
            }
            return;
        }

        let mut st = Staging::new(requests);
        let mut done: Vec<Staged> = Vec::with_capacity(batch.len());
        // What the batch does to the number of pending schedules.
        let mut sched_delta = 0i64;
        // The earliest `deliver_at` the batch adds (lowers the due floor
        // once committed).
        let mut sched_added_min: Option<u64> = None;
        for op in batch.drain(..) {
            if st.storage_error.is_some() {
                done.push(Staged::unstaged(op));
                continue;
            }
            match op {
                Op::Append(req, reply) => {
                    let (result, fanout) =
                        st.write(|ws, idem, tally| self.stage_append(req, ws, idem, tally));
                    done.push(Staged::Append { reply, result, fanout });
                }
                Op::AppendBatch(reqs, reply) => {
                    let mut results = Vec::with_capacity(reqs.len());
                    let mut fanout = Vec::with_capacity(reqs.len());
                    for req in reqs {
                        // After a storage error the rest is not staged (the
                        // whole group commit fails).
                        if st.storage_error.is_some() {
                            results.push(Err(EngineError::ShuttingDown));
                            continue;
                        }
                        let (result, msg) =
                            st.write(|ws, idem, tally| self.stage_append(req, ws, idem, tally));
                        results.push(result);
                        fanout.extend(msg);
                    }
                    done.push(Staged::AppendBatch { reply, results, fanout });
                }
                Op::Ack(req, reply) => {
                    let result = match self.stage_ack(&req, &mut st.ws, &mut st.tally) {
                        Ok(result) => result,
                        Err(e) => {
                            st.storage_error = Some(e);
                            Err(EngineError::ShuttingDown.into())
                        }
                    };
                    done.push(Staged::Ack { reply, result });
                }
                Op::Presence(cmd) => {
                    let (staged, error) = self.stage_presence(cmd, &mut st.ws, &mut st.tally);
                    st.storage_error = error;
                    done.push(Staged::Presence(staged));
                }
                Op::Room(write, reply) => {
                    let (result, fanout) =
                        st.write(|ws, idem, tally| self.stage_room(write, ws, idem, tally));
                    done.push(Staged::Room { reply, result, fanout });
                }
                Op::Sched(cmd) => {
                    let before = st.ws.len();
                    let (staged, delta, error) =
                        self.stage_sched(cmd, &mut st.ws, &mut st.pending_idem, &mut st.tally);
                    // A schedule is as durable as an append once it is
                    // answered, and so is its delivery or cancel.
                    st.appended |= st.ws.len() > before;
                    sched_delta += delta;
                    if let Some(at) = staged.added_at() {
                        sched_added_min = Some(sched_added_min.map_or(at, |m: u64| m.min(at)));
                    }
                    st.storage_error = error;
                    done.push(Staged::Sched(staged));
                }
            }
        }
        let Staging { mut ws, tally, appended, storage_error, .. } = st;
        self.stage_metas(&mut ws);
        let sync = appended && self.fsync == FsyncMode::Always;
        let outcome = match storage_error {
            Some(e) => Err(e),
            None => self.commit(ws, sync),
        };
        bump(&counters.batches, 1);
        bump(&counters.batch_requests, n);
        if let Err(e) = outcome {
            // The staged state never became visible; the caches are stale.
            self.channels.clear();
            self.cursors.reset();
            let reason = self.shared.fail(format!("group commit failed: {e}"));
            bump(&counters.failed, n);
            for p in done {
                p.fail(&reason);
            }
            return;
        }
        self.cursors.end_batch();
        counters.add(&tally);
        self.shared.add_schedules_pending(sched_delta);
        if let Some(at) = sched_added_min {
            self.shared.due_floor.lower(at);
        }
        if self.channels.len() > CHANNEL_CACHE_CAP {
            self.channels.clear();
        }

        let sink = self.shared.sink();
        let mut fanout = Vec::with_capacity(done.len());
        for p in done {
            p.answer(&mut fanout);
        }
        if let Some(sink) = sink {
            sink.deliver_batch(fanout);
        }
    }

    /// Stage the meta of every channel the batch changed, once per channel
    /// (a batch of a thousand appends to one channel writes its meta once),
    /// from the cache the appends updated.
    pub(crate) fn stage_metas(&mut self, ws: &mut WriteSet) {
        for channel in self.dirty_metas.drain() {
            if let Some(meta) = self.channels.get(&channel) {
                ws.put(
                    Space::Channels,
                    self.shared.storage.key_layout().channel_key(channel.as_str()),
                    meta.encode(),
                );
            }
        }
    }

    /// The channel's head/first, from the cache or the store.
    pub(crate) fn channel_meta(&mut self, channel: &ChannelName) -> Result<&mut ChannelMeta, StorageError> {
        use std::collections::hash_map::Entry;
        match self.channels.entry(channel.clone()) {
            Entry::Occupied(e) => Ok(e.into_mut()),
            Entry::Vacant(e) => Ok(e.insert(self.shared.storage.channel_meta(channel.as_str())?)),
        }
    }
}

/// The requests `ops` carry.
fn requests_in(ops: &[Op]) -> usize {
    ops.iter().map(Op::requests).sum()
}

/// Queue a request into `batch`; `true` for a close request.
fn collect(cmd: Command, batch: &mut Vec<Op>) -> bool {
    match cmd {
        Command::Append { req, reply } => {
            batch.push(Op::Append(req, reply));
            false
        }
        Command::AppendBatch(reqs, reply) => {
            batch.push(Op::AppendBatch(reqs, reply));
            false
        }
        Command::Ack { req, reply } => {
            batch.push(Op::Ack(req, reply));
            false
        }
        Command::Presence(cmd) => {
            batch.push(Op::Presence(cmd));
            false
        }
        Command::Room { write, reply } => {
            batch.push(Op::Room(write, reply));
            false
        }
        Command::Sched(cmd) => {
            batch.push(Op::Sched(cmd));
            false
        }
        Command::Close => true,
    }
}

struct DoneGuard(Arc<Shared>);

impl Drop for DoneGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail("writer thread panicked".into());
        }
        self.0.mark_writer_done();
    }
}
