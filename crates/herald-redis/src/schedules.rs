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

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use herald_core::{
    AppendRequest, Claim, Delivered, EngineError, Epoch, Receipt, Schedule, ScheduleReceipt, ScheduleRequest,
};
use herald_proto::ChannelName;
use redis::Value;
use uuid::Uuid;

use crate::decode::{array, opt, string};
use crate::frame::FrameTemplate;
use crate::ops::{hex, ms, new_epoch, Shared};
use crate::scripts;
use crate::stats::bump;

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

impl Shared {
    fn refuse_when_closing(&self) -> Result<(), EngineError> {
        if self.closing.load(Ordering::Acquire) {
            return Err(EngineError::ShuttingDown);
        }
        Ok(())
    }

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
            // appends, see `ops.rs`).
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
                bump(&self.counters.dedup_mismatches);
                return Err(EngineError::IdempotencyMismatch);
            }
        }
        let id = Uuid::now_v7().hyphenated().to_string();
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
        let mut inv = scripts::SCHED_ADD.prepare_invoke();
        inv.key(self.keys.sched(&ch)).key(self.keys.sched_idx(&ch));
        let (fp, ttl) = match &req.dedup {
            Some(d) => {
                inv.key(self.keys.sched_receipt(&ch, &d.key));
                (hex(&d.fingerprint), ms(d.ttl))
            }
            None => (String::new(), 1),
        };
        inv.arg(&id).arg(req.deliver_at).arg(record).arg(fp).arg(ttl);
        let reply =
            self.redis.call("schedule", |mut c| async move { inv.invoke_async::<Value>(&mut c).await }).await;
        let reply = self.failed(reply)?;
        let mut r = array(reply, "schedule reply").map_err(|_| malformed("reply"))?.into_iter();
        let mut next = |what: &'static str| {
            r.next().ok_or_else(|| malformed(what)).and_then(|v| string(v, what).map_err(|_| malformed(what)))
        };
        match next("kind")?.as_str() {
            "ok" => Ok(ScheduleReceipt {
                id: Arc::from(id),
                channel: ch,
                deliver_at: req.deliver_at,
                duplicate: false,
            }),
            "dup" => {
                let (orig, at) = (next("id")?, next("deliver_at")?);
                let at: u64 = at.parse().map_err(|_| malformed("deliver_at"))?;
                bump(&self.counters.dedup_hits);
                self.unindex_schedule(&id, &ch).await;
                Ok(ScheduleReceipt { id: Arc::from(orig), channel: ch, deliver_at: at, duplicate: true })
            }
            "mismatch" => {
                bump(&self.counters.dedup_mismatches);
                self.unindex_schedule(&id, &ch).await;
                Err(EngineError::IdempotencyMismatch)
            }
            _ => Err(malformed("reply kind")),
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
        let mut inv = scripts::SCHED_CANCEL.prepare_invoke();
        inv.key(self.keys.sched(&ch)).key(self.keys.sched_idx(&ch)).key(self.keys.sched_claims(&ch)).arg(id);
        let r = self
            .redis
            .call("schedule cancel", |mut c| async move { inv.invoke_async::<Option<String>>(&mut c).await })
            .await;
        let rec = self.failed(r)?;
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
        let mut inv = scripts::SCHED_CLAIM.prepare_invoke();
        inv.key(self.keys.sched(&ch)).key(self.keys.sched_claims(&ch)).arg(id).arg(lease_ms);
        let r = self
            .redis
            .call("schedule claim", |mut c| async move { inv.invoke_async::<Value>(&mut c).await })
            .await;
        let reply = self.failed(r)?;
        let mut r = array(reply, "claim reply").map_err(|_| malformed("claim reply"))?.into_iter();
        let mut next = |what: &'static str| {
            r.next().ok_or_else(|| malformed(what)).and_then(|v| string(v, what).map_err(|_| malformed(what)))
        };
        match next("kind")?.as_str() {
            "ok" => {
                let token: u64 = next("token")?.parse().map_err(|_| malformed("token"))?;
                let schedule = parse(id, &next("record")?)?;
                Ok(Some(Claim { schedule, token }))
            }
            "held" => Ok(None),
            "missing" => {
                if at.saturating_add(ORPHAN_GRACE_MS) < now {
                    self.unindex_schedule(id, &ch).await;
                }
                Ok(None)
            }
            _ => Err(malformed("claim kind")),
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
        let id = Uuid::now_v7().hyphenated().to_string();
        let tpl = FrameTemplate::new(req.kind, ch, req.durable, &id, &req.data, req.meta.as_ref());
        let k = &self.keys;
        let mut inv = scripts::SCHED_DELIVER.prepare_invoke();
        inv.key(k.meta(ch)).key(k.log(ch)).key(k.sched(ch)).key(k.sched_idx(ch)).key(k.sched_claims(ch));
        inv.arg(&*s.id)
            .arg(claim.token)
            .arg(if req.durable { "1" } else { "0" })
            .arg(new_epoch())
            .arg(req.retention.max_len)
            .arg(req.retention.max_age.map_or(0, ms))
            .arg(tpl.head)
            .arg(tpl.middle)
            .arg(tpl.tail)
            .arg(&id)
            .arg(ch.as_str())
            .arg(k.fan(ch))
            .arg(self.publish_cmd());
        let r = self
            .redis
            .call("schedule deliver", |mut c| async move { inv.invoke_async::<Value>(&mut c).await })
            .await;
        let reply = self.failed(r)?;
        let mut r = array(reply, "deliver reply").map_err(|_| malformed("deliver reply"))?.into_iter();
        let mut next = |what: &'static str| {
            r.next().ok_or_else(|| malformed(what)).and_then(|v| string(v, what).map_err(|_| malformed(what)))
        };
        match next("kind")?.as_str() {
            "ok" => {
                let (seq, ts, epoch, lost) =
                    (next("seq")?, next("ts")?, next("epoch")?, next("lost")? == "1");
                let seq = opt(&seq).map(|s| s.parse().map_err(|_| malformed("seq"))).transpose()?;
                let ts = ts.parse().map_err(|_| malformed("ts"))?;
                let epoch = Epoch::new(opt(&epoch).unwrap_or(""));
                if lost {
                    self.note_lost_meta(ch, epoch.as_str());
                }
                if req.durable {
                    bump(&self.counters.appends);
                } else {
                    bump(&self.counters.volatile);
                }
                self.unindex_schedule(&s.id, &s.channel).await;
                let receipt =
                    Receipt { channel: ch.clone(), seq, id: Arc::from(id), epoch, ts, duplicate: false };
                Ok(Delivered::Appended(receipt))
            }
            "stale" => Ok(Delivered::Stale),
            "closed" => {
                bump(&self.counters.closed_refused);
                Err(EngineError::Closed)
            }
            _ => Err(malformed("deliver kind")),
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
