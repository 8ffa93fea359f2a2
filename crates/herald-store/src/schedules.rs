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
use uuid::Uuid;

use crate::append::stage_receipt;
use crate::codec::IdemRecord;
use crate::stage::{Stage, Staged, Staging};
use crate::storage::{Read, Space, Storage, StorageError, WriteSet};
use crate::writer::Writer;

/// The `epoch` field of a schedule's receipt in `idem` (a marker, no log's).
const SCHEDULE_RECEIPT: &str = "schedule";

/// `Schedules::schedule`: stores the schedule, or answers a retry with its
/// receipt.
impl Stage for ScheduleRequest {
    type Ok = ScheduleReceipt;
    type Err = EngineError;
    /// A schedule is as durable as an append once it is answered.
    const FSYNC: bool = true;

    fn stage(self, w: &mut Writer, st: &mut Staging) -> Staged<Self> {
        let req = self;
        let now = w.shared.clock.now_ms();
        let mut stale_exp_key = None;
        if let Some(dedup) = &req.dedup {
            let found;
            (found, stale_exp_key) = w.find_receipt(&dedup.key, &st.pending_idem, now)?;
            if let Some(rec) = found {
                if rec.fingerprint != dedup.fingerprint || rec.epoch != SCHEDULE_RECEIPT {
                    return Ok(Err(EngineError::IdempotencyMismatch));
                }
                let channel = ChannelName::new(&rec.channel)
                    .map_err(|e| StorageError::Corrupt(format!("receipt with a bad channel name: {e}")))?;
                return Ok(Ok(ScheduleReceipt {
                    id: crate::codec::id_str(&rec.id),
                    channel,
                    deliver_at: rec.ts,
                    duplicate: true,
                }));
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
        st.ws.put(Space::Schedules, id.as_bytes().to_vec(), s.encode_record());
        st.ws.put(Space::SchedulesDue, due_key(s.deliver_at, &id), Vec::new());
        st.ws.put(Space::SchedulesByChannel, channel_key(&s.channel, s.deliver_at, &id), Vec::new());
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
            stage_receipt(st, &dedup.key, rec, stale_exp_key);
        }
        st.schedule_added(s.deliver_at);
        Ok(Ok(ScheduleReceipt { id, channel: s.channel, deliver_at: s.deliver_at, duplicate: false }))
    }
}

/// `Schedules::schedule_cancel`: removes the schedule, answering what it
/// was (`None`: not stored).
pub(crate) struct Cancel {
    pub id: Arc<str>,
}

impl Stage for Cancel {
    type Ok = Option<Schedule>;
    type Err = EngineError;
    const FSYNC: bool = true;

    fn stage(self, w: &mut Writer, st: &mut Staging) -> Staged<Self> {
        let found = schedule_at(w, &self.id, &st.ws)?;
        if let Some(s) = &found {
            remove_schedule(s, st);
        }
        Ok(Ok(found))
    }
}

/// `Schedules::schedule_deliver`: the append and the schedule's removal in
/// one commit, if the schedule is still stored.
pub(crate) struct Deliver {
    pub id: Arc<str>,
    pub req: AppendRequest,
}

impl Stage for Deliver {
    type Ok = Delivered;
    type Err = EngineError;
    const FSYNC: bool = true;

    fn stage(self, w: &mut Writer, st: &mut Staging) -> Staged<Self> {
        let Some(s) = schedule_at(w, &self.id, &st.ws)? else { return Ok(Ok(Delivered::Stale)) };
        let receipt = match self.req.stage(w, st)? {
            Ok(receipt) => receipt,
            Err(refused) => return Ok(Err(refused)),
        };
        remove_schedule(&s, st);
        Ok(Ok(Delivered::Appended(receipt)))
    }
}

/// The schedule `id` as this batch leaves it.
fn schedule_at(w: &Writer, id: &str, ws: &WriteSet) -> Result<Option<Schedule>, StorageError> {
    let v = match ws.staged(Space::Schedules, id.as_bytes()) {
        Some(staged) => staged.map(<[u8]>::to_vec),
        None => w.shared.storage.get(Space::Schedules, id.as_bytes())?,
    };
    v.map(|v| decode(id, &v)).transpose()
}

/// Stage the removal of `s`: its record and both index entries.
fn remove_schedule(s: &Schedule, st: &mut Staging) {
    st.ws.delete(Space::Schedules, s.id.as_bytes().to_vec());
    st.ws.delete(Space::SchedulesDue, due_key(s.deliver_at, &s.id));
    st.ws.delete(Space::SchedulesByChannel, channel_key(&s.channel, s.deliver_at, &s.id));
    st.schedule_removed();
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
