//! Scheduled delivery: a message stored now and appended at a set time,
//! exactly once, across restarts and nodes.
//!
//! A schedule is a durable record (channel, `deliver_at`, `data`, `meta`)
//! kept in the engine, ordered by `(deliver_at, id)`; ids are UUIDv7, so the
//! id order is the order schedules were made. Nothing holds a timer per
//! schedule: the server's scheduler asks for the next due time
//! ([`Schedules::schedule_next`]) and claims what is due
//! ([`Schedules::schedules_claim`]).
//!
//! Exactly once rests on [`Schedules::schedule_deliver`]: the append and the
//! removal of the schedule are one atomic step, refused (nothing appended)
//! when the schedule is gone (delivered, cancelled) or the claim was fenced
//! off by a later one. A claim is a lease: a node that dies or pauses
//! holding it loses it when it expires, and another node's claim takes a
//! greater fencing token, so the late delivery of the first appends
//! nothing.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use herald_proto::{ChannelName, Meta};
use serde_json::value::RawValue;

use super::{AppendRequest, Dedup, EngineError, Receipt};

/// A request to schedule one message.
#[derive(Debug)]
pub struct ScheduleRequest {
    pub channel: ChannelName,
    /// When to append it, ms since the Unix epoch (the caller has clamped
    /// it: a past time means "as soon as possible").
    pub deliver_at: u64,
    pub data: Box<RawValue>,
    pub meta: Option<Meta>,
    /// The schedule's own idempotency: a hit returns the original
    /// [`ScheduleReceipt`] (with `duplicate`) and schedules nothing.
    pub dedup: Option<Dedup>,
}

/// What the scheduling caller is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleReceipt {
    pub id: Arc<str>,
    pub channel: ChannelName,
    pub deliver_at: u64,
    /// The dedup key matched an earlier schedule; nothing was stored now.
    pub duplicate: bool,
}

/// A pending schedule.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// UUIDv7, made by the engine.
    pub id: Arc<str>,
    pub channel: ChannelName,
    pub deliver_at: u64,
    /// Engine time of the schedule, ms since the Unix epoch.
    pub created_at: u64,
    pub data: Box<RawValue>,
    pub meta: Option<Meta>,
}

impl Schedule {
    /// Bytes of `data`.
    pub fn size(&self) -> usize {
        self.data.get().len()
    }

    /// The stored record, as both engines keep it (JSON: small, rare, and
    /// `data` stays raw): everything but the id, which is the record's key.
    pub fn encode_record(&self) -> Vec<u8> {
        let r = RecordRef {
            c: self.channel.as_str(),
            t: self.deliver_at,
            r: self.created_at,
            d: &self.data,
            m: self.meta.as_ref(),
        };
        serde_json::to_vec(&r).expect("schedule records serialise")
    }

    /// Read back a record of [`Self::encode_record`] stored under `id`;
    /// the error says what is wrong with it.
    pub fn decode_record(id: &str, record: &[u8]) -> Result<Schedule, String> {
        let r: Record = serde_json::from_slice(record).map_err(|e| format!("schedule record: {e}"))?;
        let channel =
            ChannelName::new(&r.c).map_err(|e| format!("schedule record with a bad channel name: {e}"))?;
        Ok(Schedule { id: Arc::from(id), channel, deliver_at: r.t, created_at: r.r, data: r.d, meta: r.m })
    }
}

#[derive(serde::Serialize)]
struct RecordRef<'a> {
    c: &'a str,
    t: u64,
    r: u64,
    d: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    m: Option<&'a Meta>,
}

#[derive(serde::Deserialize)]
struct Record {
    c: String,
    t: u64,
    r: u64,
    d: Box<RawValue>,
    #[serde(default)]
    m: Option<Meta>,
}

/// A schedule claimed for delivery, with its fencing token. Only the
/// latest claim of a schedule can deliver it.
#[derive(Debug, Clone)]
pub struct Claim {
    pub schedule: Schedule,
    pub token: u64,
}

/// The result of [`Schedules::schedule_deliver`].
#[derive(Debug)]
pub enum Delivered {
    /// Appended now (the schedule is gone with it).
    Appended(Receipt),
    /// Nothing appended: the schedule is gone (delivered or cancelled) or
    /// the claim was fenced off by a later one.
    Stale,
}

/// Schedules (see the module docs).
#[async_trait]
pub trait Schedules: Send + Sync + 'static {
    /// Store a schedule durably (as durable as an append) and return its
    /// receipt. With `dedup`, the check and the store are one atomic step;
    /// a hit with another fingerprint is [`EngineError::IdempotencyMismatch`].
    async fn schedule(&self, req: ScheduleRequest) -> Result<ScheduleReceipt, EngineError>;

    /// Up to `limit` pending schedules of `channel`, in `(deliver_at, id)`
    /// order.
    async fn scheduled(&self, channel: &ChannelName, limit: usize) -> Result<Vec<Schedule>, EngineError>;

    /// Remove a pending schedule; `None` when there is none with this id
    /// (never made, delivered, cancelled). A cancelled schedule is never
    /// delivered, also when a claim on it is in flight.
    async fn schedule_cancel(&self, id: &str) -> Result<Option<Schedule>, EngineError>;

    /// Claim up to `limit` schedules with `deliver_at <= now` (engine time
    /// decides nothing here: `now` is the caller's), oldest `(deliver_at,
    /// id)` first, skipping those under another unexpired claim. Each claim
    /// holds for `lease`; a later claim of the same schedule (after the
    /// lease) gets a greater token.
    async fn schedules_claim(
        &self,
        now: u64,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<Claim>, EngineError>;

    /// Append `req` (the schedule's message, made by the caller from the
    /// schedule and its namespace) and remove the schedule, as one atomic
    /// step; [`Delivered::Stale`] with nothing appended when the schedule
    /// is gone or `claim.token` is not its latest claim. An append refused
    /// by the log ([`EngineError::Closed`]) leaves the schedule in place.
    async fn schedule_deliver(&self, claim: &Claim, req: AppendRequest) -> Result<Delivered, EngineError>;

    /// The earliest `deliver_at` of any pending schedule.
    async fn schedule_next(&self) -> Result<Option<u64>, EngineError>;

    /// How many schedules are pending (for the gauge).
    async fn schedules_pending(&self) -> Result<u64, EngineError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_keeps_its_stored_layout_and_reads_back() {
        let s = Schedule {
            id: Arc::from("s1"),
            channel: ChannelName::new("chat:1").unwrap(),
            deliver_at: 5,
            created_at: 4,
            data: RawValue::from_string(r#"{"b":1, "a":2}"#.into()).unwrap(),
            meta: None,
        };
        let bytes = s.encode_record();
        // The layout both engines have on disk / in Redis: `data` byte for byte.
        assert_eq!(std::str::from_utf8(&bytes).unwrap(), r#"{"c":"chat:1","t":5,"r":4,"d":{"b":1, "a":2}}"#);
        let back = Schedule::decode_record("s1", &bytes).unwrap();
        assert_eq!(
            (&*back.id, back.channel.as_str(), back.deliver_at, back.created_at),
            ("s1", "chat:1", 5, 4)
        );
        assert_eq!(back.data.get(), s.data.get());
        assert!(Schedule::decode_record("s1", br#"{"c":"bad name!","t":1,"r":1,"d":1}"#).is_err());
        assert!(Schedule::decode_record("s1", b"{").is_err());
    }
}
