//! The engine's Redis operations: append, read, acks and cursors, each one
//! script or command on the keys of one channel (see `keys.rs` and
//! `scripts.rs`). Presence is in `presence.rs`, rooms in `rooms.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use herald_core::{
    AckError, AppendRequest, CursorState, EngineError, Epoch, FanoutSink, Message, Position, Receipt, Seq,
    SubscriberId, UserCursor,
};
use herald_proto::ChannelName;
use redis::{ScriptInvocation, Value};
use uuid::Uuid;

use crate::conn::Redis;
use crate::decode::{self, array, opt, string, u64_of};
use crate::fanout::Fanout;
use crate::frame::FrameTemplate;
use crate::keys::{self, Keys};
use crate::scripts;
use crate::stats::{bump, Counters};

/// Most entries of the "user index entry is written" cache; past it the
/// cache starts over (it only saves a round trip per first ack).
const INDEXED_CACHE_CAP: usize = 65_536;
/// Largest page one read returns, whatever the caller asks for.
const MAX_READ: usize = 10_000;

/// Everything the engine's handle and its background tasks share.
pub(crate) struct Shared {
    pub redis: Redis,
    pub keys: Keys,
    /// How long a presence sweeper's claim on a channel lasts.
    pub sweep_claim_ms: u64,
    pub counters: Counters,
    pub sink: OnceLock<Arc<dyn FanoutSink>>,
    pub closing: AtomicBool,
    pub fanout: Fanout,
    /// `(channel, subscriber key)` whose user-index entry is known written.
    indexed: Mutex<HashSet<(ChannelName, String)>>,
}

/// A page as read by the `READ` script.
pub(crate) struct RawPage {
    pub position: Position,
    pub messages: Vec<Arc<Message>>,
}

pub(crate) fn new_epoch() -> String {
    Uuid::now_v7().hyphenated().to_string()
}

pub(crate) fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl Shared {
    pub fn new(redis: Redis, fanout: Fanout, keys: Keys, sweep_claim_ms: u64) -> Self {
        Self {
            redis,
            keys,
            sweep_claim_ms,
            counters: Counters::default(),
            sink: OnceLock::new(),
            closing: AtomicBool::new(false),
            fanout,
            indexed: Mutex::new(HashSet::new()),
        }
    }

    pub fn publish_cmd(&self) -> &'static str {
        if self.redis.cluster {
            "SPUBLISH"
        } else {
            "PUBLISH"
        }
    }

    pub fn failed<T>(&self, r: Result<T, EngineError>) -> Result<T, EngineError> {
        if r.is_err() {
            bump(&self.counters.unavailable);
        }
        r
    }

    /// Log and count a loss the scripts noticed (a meta missing while its
    /// log exists).
    pub fn note_lost_meta(&self, channel: &ChannelName, epoch: &str) {
        bump(&self.counters.data_loss_detected);
        tracing::warn!(
            channel = %channel,
            new_epoch = epoch,
            "redis lost the channel's meta while its log exists; new epoch (clients resync)"
        );
    }

    pub async fn append(&self, req: AppendRequest) -> Result<Receipt, EngineError> {
        let mut out = self.append_batch(vec![req]).await;
        out.pop().unwrap_or_else(|| Err(EngineError::Unavailable("redis append: no reply".into())))
    }

    /// Several appends as one submission, each answered as if appended
    /// alone, in the order given (see `Log::append_batch`): the dedup keys'
    /// claims in one round trip, then one `APPEND` script run per channel
    /// holding that channel's messages in batch order, all of them in one
    /// pipeline on one connection (a cluster: each channel's run on its own
    /// slot, concurrently). A channel's messages are in one script run, so
    /// a retry after `NOSCRIPT` cannot reorder them.
    pub async fn append_batch(&self, reqs: Vec<AppendRequest>) -> Vec<Result<Receipt, EngineError>> {
        if self.closing.load(Ordering::Acquire) {
            return reqs.iter().map(|_| Err(EngineError::ShuttingDown)).collect();
        }
        let mut out: Vec<Option<Result<Receipt, EngineError>>> = reqs.iter().map(|_| None).collect();
        if let Err(e) = self.claim_keys(&reqs, &mut out).await {
            bump(&self.counters.unavailable);
            return reqs.iter().map(|_| Err(e.clone())).collect();
        }
        // The channels in order of first appearance, each with its
        // messages in batch order (the ones not refused by their claim).
        let mut groups: Vec<(ChannelName, Vec<usize>)> = Vec::new();
        let mut group_of: HashMap<&ChannelName, usize> = HashMap::new();
        for (i, req) in reqs.iter().enumerate() {
            if out[i].is_some() {
                continue;
            }
            let g = *group_of.entry(&req.channel).or_insert_with(|| {
                groups.push((req.channel.clone(), Vec::new()));
                groups.len() - 1
            });
            groups[g].1.push(i);
        }
        drop(group_of);
        let ids: Vec<String> = reqs.iter().map(|_| Uuid::now_v7().hyphenated().to_string()).collect();
        let invocations: Vec<ScriptInvocation<'static>> =
            groups.iter().map(|(ch, members)| self.append_invocation(ch, members, &reqs, &ids)).collect();
        let replies = self.run_appends(&invocations).await;
        for ((_, members), reply) in groups.iter().zip(replies) {
            let parsed = reply.and_then(|v| {
                let entries = array(v, "append reply")
                    .map_err(|e| EngineError::Unavailable(format!("redis append: {e}")))?;
                if entries.len() != members.len() {
                    return Err(EngineError::Unavailable("redis append: malformed reply".into()));
                }
                Ok(entries)
            });
            match parsed {
                Ok(entries) => {
                    for (&i, entry) in members.iter().zip(entries) {
                        out[i] = Some(self.receipt_of(&reqs[i], &ids[i], entry));
                    }
                }
                Err(e) => {
                    for &i in members {
                        out[i] = Some(Err(e.clone()));
                    }
                }
            }
        }
        out.into_iter()
            .map(|r| {
                let r = r.unwrap_or_else(|| Err(EngineError::Unavailable("redis append: no reply".into())));
                if matches!(r, Err(EngineError::Unavailable(_))) {
                    bump(&self.counters.unavailable);
                }
                r
            })
            .collect()
    }

    /// Claim the batch's dedup keys for their channels (`SET claim channel
    /// NX PX ttl GET`): a key first used on another channel is a mismatch,
    /// as in the embedded engine, and its request gets that answer in
    /// `out`. A key used twice in the batch is claimed once, by its first
    /// use; the later ones are judged against that claim, as they would be
    /// one after the other.
    async fn claim_keys(
        &self,
        reqs: &[AppendRequest],
        out: &mut [Option<Result<Receipt, EngineError>>],
    ) -> Result<(), EngineError> {
        let mut first_use: HashMap<&str, usize> = HashMap::new();
        let mut claims: Vec<usize> = Vec::new();
        for (i, req) in reqs.iter().enumerate() {
            if let Some(d) = &req.dedup {
                first_use.entry(&d.key).or_insert_with(|| {
                    claims.push(i);
                    i
                });
            }
        }
        if claims.is_empty() {
            return Ok(());
        }
        let cmds: Vec<redis::Cmd> = claims
            .iter()
            .map(|&i| {
                let (req, d) = (&reqs[i], reqs[i].dedup.as_ref().expect("claims have a key"));
                let mut c = redis::cmd("SET");
                c.arg(self.keys.claim(&d.key))
                    .arg(req.channel.as_str())
                    .arg("NX")
                    .arg("PX")
                    .arg(ms(d.ttl))
                    .arg("GET");
                c
            })
            .collect();
        let prev: Vec<Option<String>> = if self.redis.cluster {
            // Each key in its own slot: one call each, concurrently (the
            // keys are distinct, so their order does not matter).
            let calls = cmds.into_iter().map(|c| {
                self.redis
                    .call("claim", |mut conn| async move { c.query_async::<Option<String>>(&mut conn).await })
            });
            futures_util::future::join_all(calls).await.into_iter().collect::<Result<_, _>>()?
        } else {
            let mut pipe = redis::pipe();
            for c in cmds {
                pipe.add_command(c);
            }
            self.redis.call("claim", |mut conn| async move { pipe.query_async(&mut conn).await }).await?
        };
        let owner: HashMap<&str, &str> = claims
            .iter()
            .zip(&prev)
            .map(|(&i, p)| {
                let d = reqs[i].dedup.as_ref().expect("claims have a key");
                (&*d.key, p.as_deref().unwrap_or(reqs[i].channel.as_str()))
            })
            .collect();
        for (i, req) in reqs.iter().enumerate() {
            let Some(d) = &req.dedup else { continue };
            if owner.get(&*d.key).is_some_and(|o| *o != req.channel.as_str()) {
                bump(&self.counters.dedup_mismatches);
                out[i] = Some(Err(EngineError::IdempotencyMismatch));
            }
        }
        Ok(())
    }

    /// The `APPEND` run of one channel's messages (`members`, indexes into
    /// `reqs`, in batch order).
    fn append_invocation(
        &self,
        ch: &ChannelName,
        members: &[usize],
        reqs: &[AppendRequest],
        ids: &[String],
    ) -> ScriptInvocation<'static> {
        let mut inv = scripts::APPEND.prepare_invoke();
        inv.key(self.keys.meta(ch)).key(self.keys.log(ch));
        inv.arg(new_epoch()).arg(ch.as_str()).arg(self.keys.fan(ch)).arg(self.publish_cmd());
        let mut receipts = 2;
        for &i in members {
            let (req, id) = (&reqs[i], &ids[i]);
            let tpl = FrameTemplate::new(req.kind, ch, req.durable, id, &req.data, req.meta.as_ref());
            let (fingerprint, ttl, receipt_at) = match &req.dedup {
                Some(d) => {
                    inv.key(self.keys.receipt(ch, &d.key));
                    receipts += 1;
                    (hex(&d.fingerprint), ms(d.ttl), receipts)
                }
                None => (String::new(), 1, 0),
            };
            inv.arg(if req.durable { "1" } else { "0" })
                .arg(req.retention.max_len)
                .arg(req.retention.max_age.map_or(0, ms))
                .arg(fingerprint)
                .arg(ttl)
                .arg(tpl.head)
                .arg(tpl.middle)
                .arg(tpl.tail)
                .arg(id)
                .arg(if req.durable && req.closes { "1" } else { "0" })
                .arg(receipt_at);
        }
        inv
    }

    /// Run the `APPEND` invocations, one reply (or error) each, in order.
    /// A single instance: one pipeline on one connection; a script Redis
    /// does not have cached (`NOSCRIPT`, after a restart or a failover) is
    /// loaded and that invocation run again (each is the whole of its
    /// channel's part of the batch, so nothing runs out of order).
    async fn run_appends(&self, invs: &[ScriptInvocation<'static>]) -> Vec<Result<Value, EngineError>> {
        if invs.is_empty() {
            return Vec::new();
        }
        if self.redis.cluster || invs.len() == 1 {
            let calls = invs.iter().map(|inv| {
                self.redis.call("append", move |mut c| async move { inv.invoke_async::<Value>(&mut c).await })
            });
            return futures_util::future::join_all(calls).await;
        }
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for inv in invs {
            pipe.invoke_script(inv);
        }
        let replies: Result<Vec<Value>, EngineError> =
            self.redis.call("append", |mut c| async move { pipe.query_async(&mut c).await }).await;
        let replies = match replies {
            Ok(r) if r.len() == invs.len() => r,
            Ok(_) => {
                return invs
                    .iter()
                    .map(|_| Err(EngineError::Unavailable("redis append: malformed reply".into())))
                    .collect()
            }
            Err(e) => return invs.iter().map(|_| Err(e.clone())).collect(),
        };
        let mut out = Vec::with_capacity(invs.len());
        for (inv, reply) in invs.iter().zip(replies) {
            out.push(match reply {
                Value::ServerError(e) => {
                    let e = redis::RedisError::from(e);
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) {
                        self.redis
                            .call("append", |mut c| async move { inv.invoke_async::<Value>(&mut c).await })
                            .await
                    } else {
                        tracing::warn!(error = %e, "redis refused an append");
                        Err(EngineError::Unavailable(format!("redis append: {e}")))
                    }
                }
                v => Ok(v),
            });
        }
        out
    }

    /// One message's receipt from its entry in the `APPEND` reply.
    fn receipt_of(&self, req: &AppendRequest, id: &str, entry: Value) -> Result<Receipt, EngineError> {
        let ch = &req.channel;
        let parsed = (|| {
            let mut r = array(entry, "append entry")?.into_iter();
            let kind = string(r.next().ok_or_else(|| decode::bad("append kind"))?, "append kind")?;
            let mut next = |what| r.next().ok_or_else(|| decode::bad(what)).and_then(|v| string(v, what));
            Ok::<Result<_, EngineError>, redis::RedisError>(Ok(match kind.as_str() {
                "mismatch" => None,
                "closed" => return Ok(Err(EngineError::Closed)),
                "err" => {
                    return Ok(Err(EngineError::Unavailable(format!("redis append: {}", next("error")?))))
                }
                "ok" => {
                    let (seq, ts, epoch, lost) =
                        (next("seq")?, next("ts")?, next("epoch")?, next("lost")? == "1");
                    Some((seq, id.to_owned(), ts, epoch, false, lost))
                }
                "dup" => {
                    let (seq, id, ts, epoch) = (next("seq")?, next("id")?, next("ts")?, next("epoch")?);
                    Some((seq, id, ts, epoch, true, false))
                }
                _ => return Err(decode::bad("append kind")),
            }))
        })();
        let parsed = parsed.map_err(|e| EngineError::Unavailable(format!("redis append: {e}")))?;
        let parsed = parsed.inspect_err(|e| {
            if *e == EngineError::Closed {
                bump(&self.counters.closed_refused);
            }
        })?;
        let Some((seq, id, ts, epoch, duplicate, lost)) = parsed else {
            bump(&self.counters.dedup_mismatches);
            return Err(EngineError::IdempotencyMismatch);
        };
        let bad = |what: &str| EngineError::Unavailable(format!("redis append: malformed {what}"));
        let seq = opt(&seq).map(|s| s.parse::<Seq>().map_err(|_| bad("seq"))).transpose()?;
        let ts: u64 = ts.parse().map_err(|_| bad("ts"))?;
        let epoch = Epoch::new(opt(&epoch).unwrap_or(""));
        if lost {
            self.note_lost_meta(ch, epoch.as_str());
        }
        if duplicate {
            bump(&self.counters.dedup_hits);
        } else if req.durable {
            bump(&self.counters.appends);
        } else {
            bump(&self.counters.volatile);
        }
        Ok(Receipt { channel: ch.clone(), seq, id: Arc::from(id), epoch, ts, duplicate })
    }

    /// Position and up to `limit` messages after `after`, in one snapshot.
    /// `fail_fast = false` for the fan-out's own reads, which must notice
    /// Redis coming back.
    pub async fn read_raw(
        &self,
        ch: &ChannelName,
        after: Seq,
        limit: usize,
        fail_fast: bool,
    ) -> Result<RawPage, EngineError> {
        let limit = limit.min(MAX_READ);
        let mut inv = scripts::READ.prepare_invoke();
        inv.key(self.keys.meta(ch)).key(self.keys.log(ch)).arg(new_epoch()).arg(after).arg(limit);
        let run = |mut c: crate::conn::Conn| async move { inv.invoke_async::<Value>(&mut c).await };
        let reply = if fail_fast {
            self.redis.call("read", run).await
        } else {
            self.redis.call_unchecked("read", run).await
        };
        let reply = self.failed(reply)?;
        let page = (|| {
            let mut r = array(reply, "read reply")?.into_iter();
            let mut next = |what| r.next().ok_or_else(|| decode::bad(what));
            let epoch = Epoch::new(string(next("epoch")?, "epoch")?);
            let head = u64_of(next("head")?, "head")?;
            let first = u64_of(next("first")?, "first")?;
            let lost = u64_of(next("lost")?, "lost")? == 1;
            let entries = array(next("entries")?, "entries")?;
            let closed = u64_of(next("closed")?, "closed")? == 1;
            // The closing message is the head of a closed channel.
            let closes_at = closed.then_some(head);
            let messages = entries
                .into_iter()
                .map(|e| decode::message(e, ch, &epoch, closes_at))
                .collect::<Result<Vec<_>, _>>()?;
            Ok::<_, redis::RedisError>((
                RawPage { position: Position { epoch, first, head, closed }, messages },
                lost,
            ))
        })();
        let (page, lost) = page.map_err(|e| EngineError::Unavailable(format!("redis read: {e}")))?;
        if lost {
            self.note_lost_meta(ch, page.position.epoch.as_str());
        }
        Ok(page)
    }

    pub async fn ack(&self, ch: &ChannelName, sub: &SubscriberId, seq: Seq) -> Result<CursorState, AckError> {
        if self.closing.load(Ordering::Acquire) {
            return Err(EngineError::ShuttingDown.into());
        }
        let sk = sub.key();
        let cache_key = (ch.clone(), sk.clone());
        let mut indexed = self.indexed.lock().unwrap_or_else(|e| e.into_inner()).contains(&cache_key);
        // At most: the script says the index entry is missing, we write it,
        // the script runs again.
        for _ in 0..2 {
            let mut inv = scripts::ACK.prepare_invoke();
            inv.key(self.keys.meta(ch)).key(self.keys.cursors(ch)).arg(&sk).arg(seq).arg(if indexed {
                "1"
            } else {
                "0"
            });
            let reply =
                self.redis.call("ack", |mut c| async move { inv.invoke_async::<Value>(&mut c).await }).await;
            let reply = self.failed(reply)?;
            let parsed = (|| {
                let mut r = array(reply, "ack reply")?.into_iter();
                let kind = string(r.next().ok_or_else(|| decode::bad("ack kind"))?, "ack kind")?;
                let mut next = |what| r.next().ok_or_else(|| decode::bad(what)).and_then(|v| u64_of(v, what));
                Ok::<_, redis::RedisError>(match kind.as_str() {
                    "ok" => AckReply::Ok(CursorState { seq: next("seq")?, acked_at_ms: next("acked_at")? }),
                    "beyond" => AckReply::Beyond(next("head")?),
                    "index" => AckReply::Index,
                    _ => return Err(decode::bad("ack kind")),
                })
            })()
            .map_err(|e| EngineError::Unavailable(format!("redis ack: {e}")))?;
            match parsed {
                AckReply::Ok(state) => {
                    let mut cache = self.indexed.lock().unwrap_or_else(|e| e.into_inner());
                    if cache.len() >= INDEXED_CACHE_CAP {
                        cache.clear();
                    }
                    cache.insert(cache_key);
                    if state.seq == seq {
                        bump(&self.counters.acks);
                    }
                    return Ok(state);
                }
                AckReply::Beyond(head) => return Err(AckError::BeyondHead { seq, head }),
                AckReply::Index => {
                    // The per-user index lives in another slot: written
                    // before the cursor, so every cursor is listed (an entry
                    // whose cursor write never happened is skipped).
                    let prefix =
                        SubscriberId::user_prefix(sub.user()).expect("a SubscriberId has a valid user");
                    let (key, member) = (self.keys.user_index(&prefix), keys::user_index_member(&sk, ch));
                    let r = self
                        .redis
                        .call("index cursor", |mut c| async move {
                            redis::cmd("ZADD").arg(key).arg(0).arg(member).query_async::<()>(&mut c).await
                        })
                        .await;
                    self.failed(r)?;
                    indexed = true;
                }
            }
        }
        Err(EngineError::Unavailable("redis ack: cursor index not confirmed".into()).into())
    }

    pub async fn cursor(
        &self,
        ch: &ChannelName,
        sub: &SubscriberId,
    ) -> Result<Option<CursorState>, EngineError> {
        let (key, field) = (self.keys.cursors(ch), sub.key());
        let v: Option<String> = self
            .redis
            .call("cursor", |mut c| async move {
                redis::cmd("HGET").arg(key).arg(field).query_async(&mut c).await
            })
            .await?;
        v.map(|v| parse_cursor(&v)).transpose()
    }

    pub async fn cursors(
        &self,
        ch: &ChannelName,
        limit: usize,
    ) -> Result<Vec<(SubscriberId, CursorState)>, EngineError> {
        let mut out = Vec::new();
        // HSCAN's own position in the hash (not an ack cursor); 0 starts
        // and ends a scan.
        let mut scan_at = 0u64;
        let key = self.keys.cursors(ch);
        while out.len() < limit {
            let (k, count) = (key.clone(), limit.clamp(10, 1000));
            let (next, items): (u64, Vec<(String, String)>) = self
                .redis
                .call("cursors", |mut c| async move {
                    redis::cmd("HSCAN").arg(k).arg(scan_at).arg("COUNT").arg(count).query_async(&mut c).await
                })
                .await?;
            for (field, value) in items {
                // A field that is not a subscriber key is not ours: skip it.
                if let (Ok(sub), Ok(state)) = (SubscriberId::parse_key(&field), parse_cursor(&value)) {
                    out.push((sub, state));
                }
            }
            if next == 0 {
                break;
            }
            scan_at = next;
        }
        out.truncate(limit);
        Ok(out)
    }

    pub async fn user_cursors(&self, user: &str, limit: usize) -> Result<Vec<UserCursor>, EngineError> {
        let Some(prefix) = SubscriberId::user_prefix(user) else { return Ok(Vec::new()) };
        let key = self.keys.user_index(&prefix);
        let mut out = Vec::new();
        let mut from: Vec<u8> = b"-".to_vec();
        while out.len() < limit {
            let page = (limit - out.len()).clamp(16, 256);
            let members: Vec<Vec<u8>> =
                self.redis.lex_page("user cursors", key.clone(), from.clone(), page).await?;
            let Some(last) = members.last() else { break };
            from = [b"(".as_slice(), last].concat();
            let done = members.len() < page;
            let entries: Vec<(ChannelName, SubscriberId)> = members
                .iter()
                .filter_map(|m| {
                    let s = std::str::from_utf8(m).ok()?;
                    let (sk, ch) = s.split_once('\0')?;
                    let sub = SubscriberId::parse_key(sk).ok()?;
                    (sub.user() == user).then_some(())?;
                    Some((ChannelName::new(ch).ok()?, sub))
                })
                .collect();
            let lookups = entries.iter().map(|(ch, sub)| self.cursor(ch, sub));
            let states = futures_util::future::join_all(lookups).await;
            for ((ch, sub), state) in entries.into_iter().zip(states) {
                // No cursor: the index entry was written, the cursor not
                // (yet): skipped.
                if let Some(cursor) = state? {
                    out.push(UserCursor { channel: ch, device: sub.device_arc().cloned(), cursor });
                }
            }
            if done {
                break;
            }
        }
        out.truncate(limit);
        Ok(out)
    }
}

enum AckReply {
    Ok(CursorState),
    Beyond(Seq),
    Index,
}

fn parse_cursor(v: &str) -> Result<CursorState, EngineError> {
    let bad = || EngineError::Unavailable(format!("redis cursor: malformed value {v:?}"));
    let (seq, at) = v.split_once(':').ok_or_else(bad)?;
    Ok(CursorState { seq: seq.parse().map_err(|_| bad())?, acked_at_ms: at.parse().map_err(|_| bad())? })
}

pub(crate) fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    b.iter().fold(String::with_capacity(b.len() * 2), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}
