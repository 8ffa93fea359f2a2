//! Schedules on the writer thread and their reads.
//!
//! Three spaces: `schedules` (id → record), `schedules_due` (`deliver_at`
//! BE ++ id → empty: the global order of delivery, `(deliver_at, schedule
//! order)` since ids are UUIDv7) and `schedules_by_channel` (channel ++ `\0`
//! ++ `deliver_at` BE ++ id → empty). Every change stages the record and
//! both index entries together, so they never disagree.
//!
//! A schedule's idempotency receipt is an ordinary receipt in `idem` (the
//! server gives schedule keys their own prefix), with the schedule's id and
//! `ts = deliver_at`, expired and swept like any other.
//!
//! Delivery stages the append (`append.rs`, with its own checks) and the
//! removal of the schedule in one commit: a crash leaves either both or
//! neither, so a schedule is appended at most once, and until it is, it is
//! still pending and is delivered after a restart. Claims are in memory
//! (`ClaimBook`): one process holds every claim, and a restart forgets
//! only claims whose holder died with it.

use std::collections::HashMap;
use std::ops::{Bound, ControlFlow};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_core::{AppendRequest, Claim, Delivered, EngineError, Schedule, ScheduleReceipt, ScheduleRequest};
use herald_proto::ChannelName;
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::append::stage_receipt;
use crate::codec::IdemRecord;
use crate::storage::{Space, Storage, StorageError, WriteSet};
use crate::writer::{PendingIdem, StageError, Tally, Writer};

pub(crate) type Reply<T> = oneshot::Sender<Result<T, EngineError>>;

/// The `epoch` field of a schedule's receipt in `idem` (a marker, no log's).
const SCHEDULE_RECEIPT: &str = "schedule";

/// A schedule request for the writer, with its caller's reply.
pub(crate) enum SchedCmd {
    Add { req: ScheduleRequest, reply: Reply<ScheduleReceipt> },
    Cancel { id: Arc<str>, reply: Reply<Option<Schedule>> },
    Deliver { id: Arc<str>, req: AppendRequest, reply: Reply<Delivered> },
}

/// A staged schedule request: the reply, its result and what to fan out.
pub(crate) enum SchedDone {
    Added(Reply<ScheduleReceipt>, Result<ScheduleReceipt, EngineError>),
    Cancelled(Reply<Option<Schedule>>, Result<Option<Schedule>, EngineError>),
    Delivered(Reply<Delivered>, Result<Delivered, EngineError>, Option<Arc<herald_core::Message>>),
}

impl SchedCmd {
    pub fn unstaged(self) -> SchedDone {
        let e = EngineError::ShuttingDown;
        match self {
            SchedCmd::Add { reply, .. } => SchedDone::Added(reply, Err(e)),
            SchedCmd::Cancel { reply, .. } => SchedDone::Cancelled(reply, Err(e)),
            SchedCmd::Deliver { reply, .. } => SchedDone::Delivered(reply, Err(e), None),
        }
    }
}

impl SchedDone {
    /// The `deliver_at` of a schedule this request stored (not a duplicate).
    pub fn added_at(&self) -> Option<u64> {
        match self {
            SchedDone::Added(_, Ok(r)) if !r.duplicate => Some(r.deliver_at),
            _ => None,
        }
    }

    pub fn fail(self, reason: &str) {
        let e = EngineError::Failed(reason.to_owned());
        match self {
            SchedDone::Added(reply, _) => drop(reply.send(Err(e))),
            SchedDone::Cancelled(reply, _) => drop(reply.send(Err(e))),
            SchedDone::Delivered(reply, _, _) => drop(reply.send(Err(e))),
        }
    }

    /// Send the result (a dropped receiver is a caller that stopped
    /// waiting; the write stands) and keep the message to fan out.
    pub fn answer(self, fanout: &mut Vec<Arc<herald_core::Message>>) {
        match self {
            SchedDone::Added(reply, r) => drop(reply.send(r)),
            SchedDone::Cancelled(reply, r) => drop(reply.send(r)),
            SchedDone::Delivered(reply, r, msg) => {
                let _ = reply.send(r);
                fanout.extend(msg);
            }
        }
    }
}

fn decode(id: &str, v: &[u8]) -> Result<Schedule, StorageError> {
    Schedule::decode_record(id, v).map_err(StorageError::Corrupt)
}

fn due_key(deliver_at: u64, id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + id.len());
    k.extend_from_slice(&deliver_at.to_be_bytes());
    k.extend_from_slice(id.as_bytes());
    k
}

fn channel_prefix(channel: &ChannelName) -> Vec<u8> {
    let mut k = Vec::with_capacity(channel.as_str().len() + 1);
    k.extend_from_slice(channel.as_str().as_bytes());
    k.push(0);
    k
}

fn channel_key(channel: &ChannelName, deliver_at: u64, id: &str) -> Vec<u8> {
    let mut k = channel_prefix(channel);
    k.extend_from_slice(&due_key(deliver_at, id));
    k
}

impl Writer {
    fn schedule_at(&self, id: &str, ws: &WriteSet) -> Result<Option<Schedule>, StorageError> {
        let v = match ws.staged(Space::Schedules, id.as_bytes()) {
            Some(staged) => staged.map(<[u8]>::to_vec),
            None => self.shared.storage.get(Space::Schedules, id.as_bytes())?,
        };
        v.map(|v| decode(id, &v)).transpose()
    }

    fn remove_schedule(s: &Schedule, ws: &mut WriteSet) {
        ws.delete(Space::Schedules, s.id.as_bytes().to_vec());
        ws.delete(Space::SchedulesDue, due_key(s.deliver_at, &s.id));
        ws.delete(Space::SchedulesByChannel, channel_key(&s.channel, s.deliver_at, &s.id));
    }

    /// Stage one schedule request. Returns what it did to the pending count
    /// and whether it wrote anything that needs the append fsync.
    pub(crate) fn stage_sched(
        &mut self,
        cmd: SchedCmd,
        ws: &mut WriteSet,
        pending_idem: &mut PendingIdem,
        tally: &mut Tally,
    ) -> (SchedDone, i64, Option<StorageError>) {
        match cmd {
            SchedCmd::Add { req, reply } => match self.stage_add(req, ws, pending_idem) {
                Ok(r) => {
                    let delta = i64::from(!r.duplicate);
                    (SchedDone::Added(reply, Ok(r)), delta, None)
                }
                Err(StageError::Refused(e)) => (SchedDone::Added(reply, Err(e)), 0, None),
                Err(StageError::Storage(e)) => {
                    (SchedDone::Added(reply, Err(EngineError::ShuttingDown)), 0, Some(e))
                }
            },
            SchedCmd::Cancel { id, reply } => match self.schedule_at(&id, ws) {
                Ok(found) => {
                    if let Some(s) = &found {
                        Self::remove_schedule(s, ws);
                    }
                    let delta = -i64::from(found.is_some());
                    (SchedDone::Cancelled(reply, Ok(found)), delta, None)
                }
                Err(e) => (SchedDone::Cancelled(reply, Err(EngineError::ShuttingDown)), 0, Some(e)),
            },
            SchedCmd::Deliver { id, req, reply } => {
                let s = match self.schedule_at(&id, ws) {
                    Ok(Some(s)) => s,
                    Ok(None) => return (SchedDone::Delivered(reply, Ok(Delivered::Stale), None), 0, None),
                    Err(e) => {
                        return (
                            SchedDone::Delivered(reply, Err(EngineError::ShuttingDown), None),
                            0,
                            Some(e),
                        )
                    }
                };
                match self.stage_append(req, ws, pending_idem, tally) {
                    Ok((receipt, msg)) => {
                        Self::remove_schedule(&s, ws);
                        (SchedDone::Delivered(reply, Ok(Delivered::Appended(receipt)), msg), -1, None)
                    }
                    Err(StageError::Refused(e)) => (SchedDone::Delivered(reply, Err(e), None), 0, None),
                    Err(StageError::Storage(e)) => {
                        (SchedDone::Delivered(reply, Err(EngineError::ShuttingDown), None), 0, Some(e))
                    }
                }
            }
        }
    }

    fn stage_add(
        &mut self,
        req: ScheduleRequest,
        ws: &mut WriteSet,
        pending_idem: &mut PendingIdem,
    ) -> Result<ScheduleReceipt, StageError> {
        let now = self.shared.clock.now_ms();
        let mut stale_exp_key = None;
        if let Some(dedup) = &req.dedup {
            let found;
            (found, stale_exp_key) = self.find_receipt(&dedup.key, pending_idem, now)?;
            if let Some(rec) = found {
                if rec.fingerprint != dedup.fingerprint || rec.epoch != SCHEDULE_RECEIPT {
                    return Err(StageError::Refused(EngineError::IdempotencyMismatch));
                }
                let channel = ChannelName::new(&rec.channel)
                    .map_err(|e| StorageError::Corrupt(format!("receipt with a bad channel name: {e}")))?;
                return Ok(ScheduleReceipt {
                    id: crate::codec::id_str(&rec.id),
                    channel,
                    deliver_at: rec.ts,
                    duplicate: true,
                });
            }
        }
        let uuid = Uuid::now_v7();
        let id: Arc<str> = crate::codec::id_str(&uuid);
        let s = Schedule {
            id: id.clone(),
            channel: req.channel,
            deliver_at: req.deliver_at,
            created_at: now,
            data: req.data,
            meta: req.meta,
        };
        ws.put(Space::Schedules, id.as_bytes().to_vec(), s.encode_record());
        ws.put(Space::SchedulesDue, due_key(s.deliver_at, &id), Vec::new());
        ws.put(Space::SchedulesByChannel, channel_key(&s.channel, s.deliver_at, &id), Vec::new());
        if let Some(dedup) = &req.dedup {
            let ttl_ms = u64::try_from(dedup.ttl.as_millis()).unwrap_or(u64::MAX);
            let rec = IdemRecord {
                fingerprint: dedup.fingerprint,
                channel: s.channel.as_str().to_owned(),
                seq: None,
                id: uuid,
                ts: s.deliver_at,
                epoch: SCHEDULE_RECEIPT.to_owned(),
                expires_at: now.saturating_add(ttl_ms),
            };
            stage_receipt(ws, pending_idem, &dedup.key, rec, stale_exp_key);
        }
        Ok(ScheduleReceipt { id, channel: s.channel, deliver_at: s.deliver_at, duplicate: false })
    }
}

/// Up to `limit` schedules of `channel`, in `(deliver_at, id)` order.
pub(crate) fn by_channel(
    storage: &Storage,
    channel: &ChannelName,
    limit: usize,
) -> Result<Vec<Schedule>, StorageError> {
    let view = storage.view();
    let prefix = channel_prefix(channel);
    let mut end = prefix.clone();
    *end.last_mut().expect("non-empty") = 1;
    let mut ids = Vec::new();
    view.scan(Space::SchedulesByChannel, (Bound::Included(prefix.clone()), Bound::Excluded(end)), |k, _| {
        ids.push(String::from_utf8_lossy(&k[prefix.len() + 8..]).into_owned());
        Ok(if ids.len() >= limit { ControlFlow::Break(()) } else { ControlFlow::Continue(()) })
    })?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(v) = view.get(Space::Schedules, id.as_bytes())? {
            out.push(decode(&id, &v)?);
        }
    }
    Ok(out)
}

/// Schedules due at `now`, in order, skipping those `skip` says are
/// claimed, up to `limit`.
pub(crate) fn due(
    storage: &Storage,
    floor: &DueFloor,
    now: u64,
    limit: usize,
    mut skip: impl FnMut(&str) -> bool,
) -> Result<Vec<Schedule>, StorageError> {
    let (from, generation) = floor.read();
    let view = storage.view();
    let end = (now.saturating_add(1)).to_be_bytes().to_vec();
    let mut ids = Vec::new();
    let mut first = None;
    let range = (Bound::Included(from.to_be_bytes().to_vec()), Bound::Excluded(end));
    view.scan(Space::SchedulesDue, range, |k, _| {
        first.get_or_insert_with(|| u64::from_be_bytes(k[..8].try_into().expect("8 bytes")));
        let id = String::from_utf8_lossy(&k[8..]).into_owned();
        if !skip(&id) {
            ids.push(id);
        }
        Ok(if ids.len() >= limit { ControlFlow::Break(()) } else { ControlFlow::Continue(()) })
    })?;
    // Nothing below `first` (or, with nothing found, below `now + 1`) is
    // stored any more.
    floor.raise(first.unwrap_or(now.saturating_add(1)), generation);
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(v) = view.get(Space::Schedules, id.as_bytes())? {
            out.push(decode(&id, &v)?);
        }
    }
    Ok(out)
}

/// The earliest `deliver_at`.
pub(crate) fn next(storage: &Storage, floor: &DueFloor) -> Result<Option<u64>, StorageError> {
    let mut first = None;
    let from = floor.read().0.to_be_bytes().to_vec();
    storage.view().scan(Space::SchedulesDue, (Bound::Included(from), Bound::Unbounded), |k, _| {
        first = k.get(..8).map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")));
        Ok(ControlFlow::Break(()))
    })?;
    Ok(first)
}

/// How many schedules are stored (a scan, once at open).
pub(crate) fn count(storage: &Storage) -> Result<u64, StorageError> {
    let mut n = 0u64;
    storage.view().scan(Space::Schedules, (Bound::Unbounded, Bound::Unbounded), |_, _| {
        n += 1;
        Ok(ControlFlow::Continue(()))
    })?;
    Ok(n)
}

/// A lower bound of every `deliver_at` in the due index, so scans start
/// there instead of walking the tombstones of delivered schedules (an LSM
/// keeps them until compaction: 100,000 delivered schedules would make
/// every scan from the start slower and slower). The writer lowers it after
/// each commit that adds a schedule (and bumps the generation); a scan
/// raises it to the first key it found only if no add committed since it
/// read the floor (same generation), so it is never above a stored entry.
#[derive(Default)]
pub(crate) struct DueFloor {
    inner: Mutex<(u64, u64)>,
}

impl DueFloor {
    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, u64)> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `(floor, generation)`.
    pub fn read(&self) -> (u64, u64) {
        *self.lock()
    }

    /// A schedule for `at` was committed.
    pub fn lower(&self, at: u64) {
        let mut g = self.lock();
        g.0 = g.0.min(at);
        g.1 += 1;
    }

    /// A scan that read `generation` found nothing below `to`.
    pub fn raise(&self, to: u64, generation: u64) {
        let mut g = self.lock();
        if g.1 == generation && to > g.0 {
            g.0 = to;
        }
    }
}

/// The claims of this process: id → (token, lease end in engine ms).
#[derive(Default)]
pub(crate) struct ClaimBook {
    inner: Mutex<Claims>,
}

/// The last token handed out, and the claims held.
type Claims = (u64, HashMap<Arc<str>, (u64, u64)>);

impl ClaimBook {
    fn lock(&self) -> std::sync::MutexGuard<'_, Claims> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `id` is under an unexpired claim at `now`.
    pub fn held(&self, id: &str, now: u64) -> bool {
        self.lock().1.get(id).is_some_and(|&(_, until)| until > now)
    }

    /// Claim `s` unless it is under an unexpired claim at `now`.
    pub fn claim(&self, s: Schedule, now: u64, lease: Duration) -> Option<Claim> {
        let mut g = self.lock();
        if g.1.get(&s.id).is_some_and(|&(_, until)| until > now) {
            return None;
        }
        g.0 += 1;
        let token = g.0;
        let until = now.saturating_add(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX));
        g.1.insert(s.id.clone(), (token, until));
        Some(Claim { schedule: s, token })
    }

    /// Whether `claim` is the latest claim of its schedule.
    pub fn current(&self, claim: &Claim) -> bool {
        self.lock().1.get(&claim.schedule.id).is_some_and(|&(t, _)| t == claim.token)
    }

    pub fn forget(&self, id: &str) {
        self.lock().1.remove(id);
    }
}
