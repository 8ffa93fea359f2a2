//! The writer thread: the only code that mutates the store. This file is
//! the batch loop; what each kind of write stages is beside its request
//! type (`append.rs`, `cursors.rs`, `presence.rs`, `rooms.rs`,
//! `schedules.rs`), behind the one interface of `stage.rs`.
//!
//! It takes every queued request (up to `max_batch`), stages each into one
//! [`Staging`] (appends: dedup check, closed check, seq assignment, frame
//! encoding, trimming, receipt; acks: compare-and-raise of a cursor;
//! presence: lease changes with fencing tokens; rooms: compare-and-set plus
//! the event's append; schedules: stored, cancelled, or delivered as an
//! append and a removal), commits its write set atomically, then answers
//! every request, then fans the new messages out in seq order. Between
//! batches it runs bounded slices of the retention sweep (`sweep.rs`) and,
//! when due, the fsync of acks and presence writes that have not had one
//! yet.
//!
//! Requests of one batch see each other: each is staged against the
//! committed state overlaid with what the batch staged before it
//! ([`WriteSet::staged`], the channel cache, the cursor book), so the batch
//! behaves exactly as if its requests had committed one by one, in queue
//! order.
//!
//! With [`FsyncMode::Always`] a batch in which a kind of write marked
//! [`Stage::FSYNC`](crate::stage::Stage::FSYNC) wrote (appends, room
//! writes, schedules) is committed with one fsync, and its acks and
//! presence writes ride along; a batch of acks and presence writes only is
//! committed without one (written to the OS, so it survives a crash of the
//! process) and is fsynced within `ack_sync_interval` by a later append
//! batch, a sweep, or the ack-sync timer, whichever comes first.
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

use herald_proto::ChannelName;
use tokio::sync::mpsc;

use crate::codec::ChannelMeta;
use crate::cursors::CursorBook;
use crate::request::Request;
use crate::shared::Shared;
use crate::stage::Staging;
use crate::storage::{Read, Space, StorageError, WriteSet};
use crate::sweep::SweepState;
use crate::FsyncMode;

/// Channels whose head/first the writer keeps in memory; past this the
/// cache is dropped after a batch and reloaded on demand (it only saves a
/// point read per batch and channel).
const CHANNEL_CACHE_CAP: usize = 65_536;

/// The writer thread's state: its queue, the fsync bookkeeping, and what
/// every kind of write stages against besides storage (the channel cache,
/// the cursor book, the removed leases).
pub(crate) struct Writer {
    pub(crate) shared: Arc<Shared>,
    rx: mpsc::Receiver<Request>,
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
    pub fn new(shared: Arc<Shared>, rx: mpsc::Receiver<Request>, config: &crate::StoreConfig) -> Self {
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
                self.shared.counters.fsyncs.bump();
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
            self.shared.counters.fsyncs.bump();
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
            Ok(()) => self.shared.counters.fsyncs.bump(),
            Err(e) => {
                self.shared.fail(format!("final sync failed: {e}"));
            }
        }
    }

    /// One group commit: stage every request, commit once, answer, fan out.
    fn process(&mut self, batch: &mut Vec<Request>) {
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
            counters.failed.add(n);
            for req in batch.drain(..) {
                req.fail(&reason);
            }
            return;
        }

        let mut st = Staging::new(requests);
        let mut staged = Ok(());
        for req in batch.iter_mut() {
            staged = req.stage(self, &mut st);
            if staged.is_err() {
                // The rest is not staged: the whole group commit fails.
                break;
            }
        }
        let Staging { mut ws, tally, fanout, fsync, schedules_delta, schedules_earliest, .. } = st;
        self.stage_metas(&mut ws);
        let sync = fsync && self.fsync == FsyncMode::Always;
        let outcome = staged.and_then(|()| self.commit(ws, sync));
        counters.batches.bump();
        counters.batch_requests.add(n);
        if let Err(e) = outcome {
            // The staged state never became visible; the caches are stale.
            self.channels.clear();
            self.cursors.reset();
            let reason = self.shared.fail(format!("group commit failed: {e}"));
            counters.failed.add(n);
            for req in batch.drain(..) {
                req.fail(&reason);
            }
            return;
        }
        self.cursors.end_batch();
        counters.add(&tally);
        self.shared.add_schedules_pending(schedules_delta);
        if let Some(at) = schedules_earliest {
            self.shared.due_floor.lower(at);
        }
        if self.channels.len() > CHANNEL_CACHE_CAP {
            self.channels.clear();
        }

        let sink = self.shared.sink();
        for req in batch.drain(..) {
            req.answer();
        }
        if let Some(sink) = sink {
            sink.deliver_batch(fanout);
        }
    }

    /// Stage the meta of every channel the batch changed, once per channel
    /// (a batch of a thousand appends to one channel writes its meta once),
    /// from the cache the appends updated.
    fn stage_metas(&mut self, ws: &mut WriteSet) {
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

/// The requests `batch` carries.
fn requests_in(batch: &[Request]) -> usize {
    batch.iter().map(Request::requests).sum()
}

/// Queue a request into `batch`; `true` for the close, which is not queued.
fn collect(req: Request, batch: &mut Vec<Request>) -> bool {
    match req {
        Request::Close => true,
        req => {
            batch.push(req);
            false
        }
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
