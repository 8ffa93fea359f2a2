//! The one interface every kind of write implements, and the group commit
//! the writer stages it into.
//!
//! A kind of write is a request type with an `impl` [`Stage`] beside it
//! (`append.rs`, `cursors.rs`, `presence.rs`, `rooms.rs`, `schedules.rs`)
//! and one arm of [`Request`](crate::request::Request). Staging has one
//! shape, [`Staged`]: `Err` is a storage failure, which fails the whole
//! batch; `Ok` is the [`Outcome`] the caller is sent once the batch has
//! committed, a refusal included (a refused request stages nothing and the
//! batch goes on). What else the writer does after the commit comes from
//! the [`Staging`] the requests staged into: the writes, the messages to
//! fan out, whether the commit waits for an fsync, the counters and the
//! schedule bookkeeping.
//!
//! Invariants: a request is staged at most once and answered exactly once
//! (its outcome after a successful commit, `Failed` otherwise); a request
//! adds a message to [`Staging::fanout`] only once it can no longer be
//! refused, so the fan-out holds exactly the batch's accepted messages, in
//! staging order (seq order per channel).

use std::sync::Arc;

use herald_core::{EngineError, Message};
use tokio::sync::oneshot;

use crate::codec::IdemRecord;
use crate::stats::Tally;
use crate::storage::{StorageError, WriteSet};
use crate::writer::Writer;

/// What the caller of a `K` is sent.
pub(crate) type Outcome<K> = Result<<K as Stage>::Ok, <K as Stage>::Err>;

/// What staging one request gives: its caller's outcome, or the storage
/// error that fails the batch.
pub(crate) type Staged<K> = Result<Outcome<K>, StorageError>;

/// Receipts staged by the batch being built, by idempotency key: a retry
/// inside one batch finds the first one's receipt before it is committed.
pub(crate) type PendingIdem = foldhash::HashMap<Arc<str>, IdemRecord>;

/// One kind of write: staged by the writer into its group commit.
pub(crate) trait Stage: Sized + Send {
    /// What the caller gets when the write is done or refused.
    type Ok: Send;
    /// How the caller is told the write was refused; a failed batch sends
    /// [`EngineError::Failed`].
    type Err: From<EngineError> + Send;
    /// Whether a commit this kind wrote into waits for the fsync under
    /// [`FsyncMode::Always`](crate::FsyncMode::Always) before its callers
    /// are answered. Every kind whose `Ok` promises durability (appends and
    /// what appends: room writes, schedules) sets it; acks and presence
    /// writes do not (see the crate docs), and ride along when a batch
    /// has it.
    const FSYNC: bool;

    /// How many requests this one counts for in a batch's `max_batch`.
    fn requests(&self) -> usize {
        1
    }

    /// Stage the write into `st`, against the committed state overlaid
    /// with what the batch staged before it. A refusal stages nothing.
    fn stage(self, w: &mut Writer, st: &mut Staging) -> Staged<Self>;
}

/// A request of kind `K` with its caller's reply, from the queue to the
/// answer.
pub(crate) struct Req<K: Stage> {
    state: State<K>,
    reply: oneshot::Sender<Outcome<K>>,
}

enum State<K: Stage> {
    /// Not staged (queued, or after a storage error ended the staging).
    Queued(K),
    /// Staged: what the caller is told once the batch has committed.
    Staged(Outcome<K>),
    /// While `K::stage` runs, which takes the request by value.
    Staging,
}

impl<K: Stage> Req<K> {
    pub fn new(write: K, reply: oneshot::Sender<Outcome<K>>) -> Self {
        Self { state: State::Queued(write), reply }
    }

    /// [`Stage::requests`] of the request (counted before staging).
    pub fn requests(&self) -> usize {
        match &self.state {
            State::Queued(write) => write.requests(),
            State::Staged(_) | State::Staging => 1,
        }
    }

    /// Stage the request into `st` and keep its outcome for the answer.
    pub fn stage(&mut self, w: &mut Writer, st: &mut Staging) -> Result<(), StorageError> {
        let State::Queued(write) = std::mem::replace(&mut self.state, State::Staging) else {
            return Ok(());
        };
        // A write that wrote puts a key no earlier request of the batch
        // wrote (a log entry, a receipt, a schedule, a removal of a stored
        // one), so a longer write set means it wrote.
        let before = st.ws.len();
        let outcome = write.stage(w, st)?;
        st.fsync |= K::FSYNC && st.ws.len() > before;
        self.state = State::Staged(outcome);
        Ok(())
    }

    /// Send the outcome (the batch committed). A dropped receiver is a
    /// caller that stopped waiting; the write stands, like a publish whose
    /// client disconnected.
    pub fn answer(self) {
        debug_assert!(matches!(self.state, State::Staged(_)), "answered a request not staged");
        if let State::Staged(outcome) = self.state {
            let _ = self.reply.send(outcome);
        }
    }

    /// Tell the caller the engine failed (the batch did not commit).
    pub fn fail(self, reason: &str) {
        let _ = self.reply.send(Err(EngineError::Failed(reason.to_owned()).into()));
    }
}

/// The group commit being built: every request of a batch stages into it,
/// and the writer commits and applies it once.
pub(crate) struct Staging {
    pub ws: WriteSet,
    pub pending_idem: PendingIdem,
    /// Counted once the batch has committed (a failed batch counts only
    /// as failed).
    pub tally: Tally,
    /// The accepted messages, in staging order, handed to the sink after
    /// the answers.
    pub fanout: Vec<Arc<Message>>,
    /// A request of a [`Stage::FSYNC`] kind wrote: under
    /// `FsyncMode::Always` the commit is fsynced.
    pub fsync: bool,
    /// What the batch does to the number of stored schedules.
    pub schedules_delta: i64,
    /// The earliest `deliver_at` the batch stores (lowers the due floor
    /// once committed).
    pub schedules_earliest: Option<u64>,
}

impl Staging {
    pub fn new(requests: usize) -> Self {
        Self {
            // An append stages up to four keys (log entry, channel meta,
            // receipt and its expiry entry); the meta is shared by a
            // channel's appends.
            ws: WriteSet::with_capacity(requests * 3),
            pending_idem: PendingIdem::with_capacity_and_hasher(requests, Default::default()),
            tally: Tally::default(),
            fanout: Vec::with_capacity(requests),
            fsync: false,
            schedules_delta: 0,
            schedules_earliest: None,
        }
    }

    /// A schedule due at `deliver_at` is stored by this batch.
    pub fn schedule_added(&mut self, deliver_at: u64) {
        self.schedules_delta += 1;
        self.schedules_earliest = Some(self.schedules_earliest.map_or(deliver_at, |m| m.min(deliver_at)));
    }

    /// A stored schedule is removed by this batch.
    pub fn schedule_removed(&mut self) {
        self.schedules_delta -= 1;
    }
}
