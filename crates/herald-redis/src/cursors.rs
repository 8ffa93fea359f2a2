//! Acks and cursors (`Cursors`): a cursor is a field of the channel's
//! cursor hash, raised by the `ACK` script; the first ack of a subscriber
//! on a channel first writes its entry in the user's index (another slot).

use herald_core::{AckError, CursorAck, CursorState, EngineError, Seq, SubscriberId, UserCursor};
use herald_proto::ChannelName;

use crate::keys;
use crate::scripts::Ack;
use crate::state::EngineState;

/// Most entries of the "user index entry is written" cache; past it the
/// cache starts over (it only saves a round trip per first ack).
const INDEXED_CACHE_CAP: usize = 65_536;

impl EngineState {
    pub async fn cursor_ack(&self, ack: CursorAck) -> Result<CursorState, AckError> {
        self.refuse_when_closing()?;
        let CursorAck { channel: ch, subscriber: sub, seq } = ack;
        let (ch, sub) = (&ch, &sub);
        let sk = sub.key();
        let cache_key = (ch.clone(), sk.clone());
        let mut indexed = self.indexed.lock().unwrap_or_else(|e| e.into_inner()).contains(&cache_key);
        // At most: the script says the index entry is missing, we write it,
        // the script runs again.
        for _ in 0..2 {
            let args = Ack {
                meta: self.keys.meta(ch),
                cursors: self.keys.cursors(ch),
                subscriber: &sk,
                seq,
                indexed,
            };
            let mut r = self.run("ack", &args).await?.fields("reply")?;
            let parsed = match r.status()?.as_str() {
                "ok" => AckReply::Ok(CursorState { seq: r.int("seq")?, acked_at_ms: r.int("acked_at")? }),
                "beyond" => AckReply::Beyond(r.int("head")?),
                "index" => AckReply::Index,
                _ => return Err(r.unexpected().into()),
            };
            match parsed {
                AckReply::Ok(state) => {
                    let mut cache = self.indexed.lock().unwrap_or_else(|e| e.into_inner());
                    if cache.len() >= INDEXED_CACHE_CAP {
                        cache.clear();
                    }
                    cache.insert(cache_key);
                    if state.seq == seq {
                        self.counters.acks.bump();
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
