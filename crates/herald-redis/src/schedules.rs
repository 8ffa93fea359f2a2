//! Scheduled delivery on Redis.
//!
//! A schedule's record, its per-channel index, its claims and its dedup
//! receipt live in the channel's slot (`p:{c}:sched*`), so the delivery
//! script checks the schedule and the claim's fencing token and appends and
//! removes the schedule in one atomic step: a paused node's late claim
//! appends nothing, and no crash can append a schedule twice.
//!
//! The global order of delivery is `p:{sched}:due` (members `<id>
//! <channel>`, scored by `deliver_at`; ties in id order, which is schedule
//! order) with `p:{sched}:where` (id → channel, for cancel by id), in one
//! other slot. They are written *before* the channel's script (a schedule
//! is never stored without being findable) and cleaned *after* a delivery
//! or cancel. A global entry whose schedule is gone (a node died between
//! the two steps, or a duplicate request's spare id) is removed by the next
//! claim that finds it more than [`ORPHAN_GRACE_MS`] overdue; before that it
//! may be an entry whose record is still being written.
//!
//! Claims: every node reads the first due entries and claims each in its
//! channel's slot (`SCHED_CLAIM`): a claim is a lease (`<token> <until>`)
//! and a new claim after it ran out takes the next token.

use std::sync::Arc;
use std::time::Duration;

use herald_core::{AppendRequest, Claim, Delivered, EngineError, Schedule, ScheduleReceipt, ScheduleRequest};
use herald_proto::ChannelName;

use crate::frame::FrameTemplate;
use crate::scripts::{SchedAdd, SchedCancel, SchedClaim, SchedDeliver};
use crate::state::{ms, new_id, EngineState};

/// How overdue (ms) a global entry without a stored schedule must be
/// before a claim removes it (see the module docs).
const ORPHAN_GRACE_MS: u64 = 60_000;

fn malformed(what: impl std::fmt::Display) -> EngineError {
    EngineError::Unavailable(format!("redis schedule: malformed {what}"))
}

fn parse(id: &str, record: &str) -> Result<Schedule, EngineError> {
    Schedule::decode_record(id, record.as_bytes()).map_err(malformed)
}

fn member(id: &str, ch: &ChannelName) -> String {
    format!("{id} {ch}")
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl EngineState {
    /// Add the global entries of a schedule (idempotent).
    async fn index_schedule(&self, id: &str, ch: &ChannelName, deliver_at: u64) -> Result<(), EngineError> {
        let (due, wh, m, id, c) =
            (self.keys.sched_due(), self.keys.sched_where(), member(id, ch), id.to_owned(), ch.to_string());
        let r = self
            .redis
            .call("schedule index", |mut c2| async move {
                redis::pipe()
                    .atomic()
                    .cmd("ZADD")
                    .arg(due)
                    .arg(deliver_at)
                    .arg(m)
                    .ignore()
                    .cmd("HSET")
                    .arg(wh)
                    .arg(id)
                    .arg(c)
                    .ignore()
                    .query_async::<()>(&mut c2)
                    .await
            })
            .await;
        self.failed(r)
    }

    /// Remove the global entries of a schedule that is gone. Best effort:
    /// a leftover is removed by a later claim.
    async fn unindex_schedule(&self, id: &str, ch: &ChannelName) {
        let (due, wh, m, id) =
            (self.keys.sched_due(), self.keys.sched_where(), member(id, ch), id.to_owned());
        let r = self
            .redis
            .call("schedule unindex", |mut c| async move {
                redis::pipe()
                    .atomic()
                    .cmd("ZREM")
                    .arg(due)
                    .arg(m)
                    .ignore()
                    .cmd("HDEL")
                    .arg(wh)
                    .arg(id)
                    .ignore()
                    .query_async::<()>(&mut c)
                    .await
            })
            .await;
        if let Err(e) = r {
            tracing::debug!(error = %e, "schedule index entry not removed; a later claim removes it");
        }
    }

    pub async fn schedule(&self, req: ScheduleRequest) -> Result<ScheduleReceipt, EngineError> {
        self.refuse_when_closing()?;
        let ch = req.channel.clone();
        if let Some(d) = &req.dedup {
            // A dedup key belongs to the channel that used it first (as for
            // appends, see `append.rs`).
            let (claim, owner, ttl) = (self.keys.claim(&d.key), ch.as_str().to_owned(), ms(d.ttl));
            let prev: Option<String> = self
                .redis
                .call("schedule claim key", |mut c| async move {
                    redis::cmd("SET")
                        .arg(claim)
                        .arg(owner)
                        .arg("NX")
                        .arg("PX")
                        .arg(ttl)
                        .arg("GET")
                        .query_async(&mut c)
                        .await
                })
                .await?;
            if prev.is_some_and(|p| p != ch.as_str()) {
                self.counters.dedup_mismatches.bump();
                return Err(EngineError::IdempotencyMismatch);
            }
        }
        let id = new_id();
        let record = Schedule {
            id: Arc::from(id.as_str()),
            channel: ch.clone(),
            deliver_at: req.deliver_at,
            created_at: now_ms(),
            data: req.data,
            meta: req.meta,
        }
        .encode_record();
        self.index_schedule(&id, &ch, req.deliver_at).await?;
        let (fingerprint, receipt_ttl_ms, receipt) = match &req.dedup {
            Some(d) => (hex::encode(d.fingerprint), ms(d.ttl), Some(self.keys.sched_receipt(&ch, &d.key))),
            None => (String::new(), 1, None),
        };
        let args = SchedAdd {
            sched: self.keys.sched(&ch),
            sched_idx: self.keys.sched_idx(&ch),
            receipt,
            id: &id,
            deliver_at: req.deliver_at,
            record: &record,
            fingerprint,
            receipt_ttl_ms,
        };
        let mut r = self.run("schedule", &args).await?.fields("reply")?;
        match r.status()?.as_str() {
            "ok" => Ok(ScheduleReceipt {
                id: Arc::from(id),
                channel: ch,
                deliver_at: req.deliver_at,
                duplicate: false,
            }),
            "dup" => {
                let (orig, at) = (r.string("id")?, r.int("deliver_at")?);
                self.counters.dedup_hits.bump();
                self.unindex_schedule(&id, &ch).await;
                Ok(ScheduleReceipt { id: Arc::from(orig), channel: ch, deliver_at: at, duplicate: true })
            }
            "mismatch" => {
                self.counters.dedup_mismatches.bump();
                self.unindex_schedule(&id, &ch).await;
                Err(EngineError::IdempotencyMismatch)
            }
            _ => Err(r.unexpected()),
        }
    }

    pub async fn scheduled(&self, ch: &ChannelName, limit: usize) -> Result<Vec<Schedule>, EngineError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let (idx, sched) = (self.keys.sched_idx(ch), self.keys.sched(ch));
        let r = self
            .redis
            .call("scheduled", |mut c| async move {
                let ids: Vec<String> =
                    redis::cmd("ZRANGE").arg(&idx).arg(0).arg(limit - 1).query_async(&mut c).await?;
                if ids.is_empty() {
                    return Ok((ids, Vec::new()));
                }
                let recs: Vec<Option<String>> =
                    redis::cmd("HMGET").arg(&sched).arg(&ids).query_async(&mut c).await?;
                Ok((ids, recs))
            })
            .await;
        let (ids, recs) = self.failed(r)?;
        ids.iter().zip(recs).filter_map(|(id, rec)| rec.map(|rec| parse(id, &rec))).collect()
    }

    pub async fn schedule_cancel(&self, id: &str) -> Result<Option<Schedule>, EngineError> {
        self.refuse_when_closing()?;
        let (wh, key) = (self.keys.sched_where(), id.to_owned());
        let r = self
            .redis
            .call("schedule where", |mut c| async move {
                redis::cmd("HGET").arg(wh).arg(key).query_async::<Option<String>>(&mut c).await
            })
            .await;
        let Some(ch) = self.failed(r)? else { return Ok(None) };
        let ch = ChannelName::new(&ch).map_err(|_| malformed("channel"))?;
        let args = SchedCancel {
            sched: self.keys.sched(&ch),
            sched_idx: self.keys.sched_idx(&ch),
            claims: self.keys.sched_claims(&ch),
            id,
        };
        let rec = self.run("schedule cancel", &args).await?.bulk("record")?;
        self.unindex_schedule(id, &ch).await;
        rec.map(|rec| parse(id, &rec)).transpose()
    }

    pub async fn schedules_claim(
        &self,
        now: u64,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<Claim>, EngineError> {
        self.refuse_when_closing()?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let due = self.keys.sched_due();
        let r = self
            .redis
            .call("schedules due", |mut c| async move {
                redis::cmd("ZRANGEBYSCORE")
                    .arg(due)
                    .arg("-inf")
                    .arg(now)
                    .arg("WITHSCORES")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(limit)
                    .query_async::<Vec<(String, u64)>>(&mut c)
                    .await
            })
            .await;
        let entries = self.failed(r)?;
        let lease_ms = ms(lease).max(1);
        let attempts = entries.iter().map(|(m, at)| async move {
            let (id, ch) = m.split_once(' ')?;
            let ch = ChannelName::new(ch).ok()?;
            Some(self.claim_one(id, ch, *at, now, lease_ms).await)
        });
        let mut out = Vec::new();
        for r in futures_util::future::join_all(attempts).await.into_iter().flatten() {
            if let Some(c) = r? {
                out.push(c);
            }
        }
        Ok(out)
    }

    async fn claim_one(
        &self,
        id: &str,
        ch: ChannelName,
        at: u64,
        now: u64,
        lease_ms: u64,
    ) -> Result<Option<Claim>, EngineError> {
        let args =
            SchedClaim { sched: self.keys.sched(&ch), claims: self.keys.sched_claims(&ch), id, lease_ms };
        let mut r = self.run("schedule claim", &args).await?.fields("reply")?;
        match r.status()?.as_str() {
            "ok" => {
                let token = r.int("token")?;
                let schedule = parse(id, &r.string("record")?)?;
                Ok(Some(Claim { schedule, token }))
            }
            "held" => Ok(None),
            "missing" => {
                if at.saturating_add(ORPHAN_GRACE_MS) < now {
                    self.unindex_schedule(id, &ch).await;
                }
                Ok(None)
            }
            _ => Err(r.unexpected()),
        }
    }

    pub async fn schedule_deliver(
        &self,
        claim: &Claim,
        req: AppendRequest,
    ) -> Result<Delivered, EngineError> {
        self.refuse_when_closing()?;
        let s = &claim.schedule;
        let ch = &req.channel;
        let id = new_id();
        let tpl = FrameTemplate::new(req.kind, ch, req.durable, &id, &req.data, req.meta.as_ref());
        let k = &self.keys;
        let args = SchedDeliver {
            meta: k.meta(ch),
            log: k.log(ch),
            sched: k.sched(ch),
            sched_idx: k.sched_idx(ch),
            claims: k.sched_claims(ch),
            id: &s.id,
            token: claim.token,
            durable: req.durable,
            event: self.event(ch, &tpl, &id, &req.retention),
        };
        let mut r = self.run("schedule deliver", &args).await?.fields("reply")?;
        match r.status()?.as_str() {
            "ok" => {
                let receipt = self.receipt(ch, &id, r.appended()?);
                if req.durable {
                    self.counters.appends.bump();
                } else {
                    self.counters.volatile.bump();
                }
                self.unindex_schedule(&s.id, &s.channel).await;
                Ok(Delivered::Appended(receipt))
            }
            "stale" => Ok(Delivered::Stale),
            "closed" => Err(self.refuse_closed()),
            _ => Err(r.unexpected()),
        }
    }

    pub async fn schedule_next(&self) -> Result<Option<u64>, EngineError> {
        let due = self.keys.sched_due();
        let r = self
            .redis
            .call("schedule next", |mut c| async move {
                redis::cmd("ZRANGE")
                    .arg(due)
                    .arg(0)
                    .arg(0)
                    .arg("WITHSCORES")
                    .query_async::<Vec<(String, u64)>>(&mut c)
                    .await
            })
            .await;
        Ok(self.failed(r)?.first().map(|(_, at)| *at))
    }

    pub async fn schedules_pending(&self) -> Result<u64, EngineError> {
        let due = self.keys.sched_due();
        let r = self
            .redis
            .call("schedules pending", |mut c| async move {
                redis::cmd("ZCARD").arg(due).query_async::<u64>(&mut c).await
            })
            .await;
        self.failed(r)
    }
}
