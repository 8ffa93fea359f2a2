//! The engine's Redis operations: append, read, acks and cursors, each one
//! script or command on the keys of one channel (see `keys.rs` and
//! `scripts.rs`). Presence is in `presence.rs`, rooms in `rooms.rs`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use herald_core::{
    AckError, AppendRequest, CursorState, EngineError, Epoch, FanoutSink, Message, Position, Receipt, Seq,
    SubscriberId, UserCursor,
};
use herald_proto::ChannelName;
use redis::Value;
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
        if self.closing.load(Ordering::Acquire) {
            return Err(EngineError::ShuttingDown);
        }
        let r = self.append_inner(req).await;
        self.failed(r)
    }

    async fn append_inner(&self, req: AppendRequest) -> Result<Receipt, EngineError> {
        let ch = &req.channel;
        let id = Uuid::now_v7().hyphenated().to_string();
        let tpl = FrameTemplate::new(req.kind, ch, req.durable, &id, &req.data, req.meta.as_ref());
        if let Some(d) = &req.dedup {
            // A dedup key belongs to the channel that used it first: the
            // receipt lives in that channel's slot, so reuse on another
            // channel is caught here (a different request, hence a mismatch).
            let (claim, owner, ttl) = (self.keys.claim(&d.key), ch.as_str().to_owned(), ms(d.ttl));
            let prev: Option<String> = self
                .redis
                .call("claim", |mut c| async move {
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
        let mut inv = scripts::APPEND.prepare_invoke();
        inv.key(self.keys.meta(ch)).key(self.keys.log(ch));
        let (fingerprint, ttl) = match &req.dedup {
            Some(d) => {
                inv.key(self.keys.receipt(ch, &d.key));
                (hex(&d.fingerprint), ms(d.ttl))
            }
            None => (String::new(), 1),
        };
        inv.arg(if req.durable { "1" } else { "0" })
            .arg(new_epoch())
            .arg(req.retention.max_len)
            .arg(req.retention.max_age.map_or(0, ms))
            .arg(fingerprint)
            .arg(ttl)
            .arg(tpl.head)
            .arg(tpl.middle)
            .arg(tpl.tail)
            .arg(&id)
            .arg(ch.as_str())
            .arg(self.keys.fan(ch))
            .arg(self.publish_cmd())
            .arg(if req.durable && req.closes { "1" } else { "0" });
        let reply: Value =
            self.redis.call("append", |mut c| async move { inv.invoke_async(&mut c).await }).await?;
        let parsed = (|| {
            let mut r = array(reply, "append reply")?.into_iter();
            let kind = string(r.next().ok_or_else(|| decode::bad("append kind"))?, "append kind")?;
            let mut next = |what| r.next().ok_or_else(|| decode::bad(what)).and_then(|v| string(v, what));
            Ok::<Result<_, EngineError>, redis::RedisError>(Ok(match kind.as_str() {
                "mismatch" => None,
                "closed" => return Ok(Err(EngineError::Closed)),
                "ok" => {
                    let (seq, ts, epoch, lost) =
                        (next("seq")?, next("ts")?, next("epoch")?, next("lost")? == "1");
                    Some((seq, id.clone(), ts, epoch, false, lost))
                }
                "dup" => {
                    let (seq, id, ts, epoch) = (next("seq")?, next("id")?, next("ts")?, next("epoch")?);
                    Some((seq, id, ts, epoch, true, false))
                }
                _ => return Err(decode::bad("append kind")),
            }))
        })();
        let parsed = parsed.map_err(|e| EngineError::Unavailable(format!("redis append: {e}")))?;
        let parsed = parsed.inspect_err(|_| bump(&self.counters.closed_refused))?;
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
        Ok(Receipt { channel: req.channel, seq, id: Arc::from(id), epoch, ts, duplicate })
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
