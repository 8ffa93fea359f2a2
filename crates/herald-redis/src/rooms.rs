//! Rooms on Redis: the record in the channel's slot, changed by one
//! compare-and-set script together with the append of its event (and, on
//! close, the closed flag and the removal of every lease), and the index of rooms
//! that are not closed.
//!
//! The index, `rooms:active`, is one sorted set (score 0, lex order) in its
//! own slot, so it is written after the room script: every write that
//! leaves a room open adds it (idempotent), a closing write removes it.
//! Readers check each entry against the room's record: a closed room (a
//! late add racing the close) is skipped and removed, a missing one (an
//! entry of a create that never happened) skipped. A room whose add was
//! lost (a node dying right after the script) is indexed again by its next
//! write; until then it is `open` and waits for its host, which needs no
//! timer: the host's join writes it (`live`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use herald_core::{EngineError, Epoch, Receipt, Room, RoomStatus, RoomWrite, RoomWritten};
use herald_proto::ChannelName;
use redis::Value;
use uuid::Uuid;

use crate::decode::{array, opt, string};
use crate::frame::FrameTemplate;
use crate::ops::{ms, new_epoch, Shared};
use crate::scripts;
use crate::stats::bump;

fn malformed(what: impl std::fmt::Display) -> EngineError {
    EngineError::Unavailable(format!("redis room: malformed {what}"))
}

fn parse_room(record: &str) -> Result<Room, EngineError> {
    serde_json::from_str(record).map_err(|e| malformed(format_args!("record ({e})")))
}

impl Shared {
    pub async fn room(&self, ch: &ChannelName) -> Result<Option<Room>, EngineError> {
        let key = self.keys.room(ch);
        let r = self
            .redis
            .call("room", |mut c| async move {
                redis::cmd("HGET").arg(key).arg("record").query_async::<Option<String>>(&mut c).await
            })
            .await;
        self.failed(r)?.map(|r| parse_room(&r)).transpose()
    }

    pub async fn room_write(&self, write: RoomWrite) -> Result<RoomWritten, EngineError> {
        if self.closing.load(Ordering::Acquire) {
            return Err(EngineError::ShuttingDown);
        }
        let RoomWrite { expected_version, room, event } = write;
        let ch = event.channel.clone();
        let closing = room.state == RoomStatus::Closed;
        // The event is durable, closes exactly when closing, and has no
        // dedup (the version check makes a retried write a conflict), as
        // the contract shapes it, whatever the caller set.
        let id = Uuid::now_v7().hyphenated().to_string();
        let tpl = FrameTemplate::new(event.kind, &ch, true, &id, &event.data, event.meta.as_ref());
        let record = serde_json::to_string(&room).expect("rooms serialise");
        let k = &self.keys;
        let mut inv = scripts::ROOM_WRITE.prepare_invoke();
        inv.key(k.meta(&ch))
            .key(k.log(&ch))
            .key(k.room(&ch))
            .key(k.presence(&ch))
            .key(k.presence_exp(&ch))
            .key(k.presence_keys(&ch))
            .key(k.presence_gone(&ch))
            .key(k.presence_gone_exp(&ch));
        inv.arg(expected_version.map(|v| v.to_string()).unwrap_or_default())
            .arg(room.version)
            .arg(record)
            .arg(if closing { "1" } else { "0" })
            .arg(new_epoch())
            .arg(event.retention.max_len)
            .arg(event.retention.max_age.map_or(0, ms))
            .arg(tpl.head)
            .arg(tpl.middle)
            .arg(tpl.tail)
            .arg(&id)
            .arg(ch.as_str())
            .arg(k.fan(&ch))
            .arg(self.publish_cmd());
        let reply = self
            .redis
            .call("room write", |mut c| async move { inv.invoke_async::<Value>(&mut c).await })
            .await;
        let reply = self.failed(reply)?;
        let mut r = array(reply, "room write reply").map_err(|_| malformed("reply"))?.into_iter();
        let mut next = |what: &'static str| {
            r.next().ok_or_else(|| malformed(what)).and_then(|v| string(v, what).map_err(|_| malformed(what)))
        };
        match next("kind")?.as_str() {
            "conflict" => {
                bump(&self.counters.room_conflicts);
                let current = next("current")?;
                let current = if current.is_empty() { None } else { Some(parse_room(&current)?) };
                Ok(RoomWritten::Conflict { current })
            }
            "closed" => {
                bump(&self.counters.closed_refused);
                Err(EngineError::Closed)
            }
            "ok" => {
                let (seq, ts, epoch, lost) =
                    (next("seq")?, next("ts")?, next("epoch")?, next("lost")? == "1");
                let seq = opt(&seq).map(|s| s.parse().map_err(|_| malformed("seq"))).transpose()?;
                let ts = ts.parse().map_err(|_| malformed("ts"))?;
                let epoch = Epoch::new(opt(&epoch).unwrap_or(""));
                if lost {
                    self.note_lost_meta(&ch, epoch.as_str());
                }
                bump(&self.counters.room_writes);
                bump(&self.counters.appends);
                self.index_room(&ch, closing).await;
                let receipt = Receipt { channel: ch, seq, id: Arc::from(id), epoch, ts, duplicate: false };
                Ok(RoomWritten::Written { room, receipt })
            }
            _ => Err(malformed("reply kind")),
        }
    }

    /// After a written room: add it to the active index, or remove it when
    /// closed. The write stands whatever happens here (see the module docs).
    async fn index_room(&self, ch: &ChannelName, closed: bool) {
        let (key, member) = (self.keys.rooms_active(), ch.to_string());
        let r = self
            .redis
            .call("rooms index", |mut c| async move {
                let mut cmd = if closed { redis::cmd("ZREM") } else { redis::cmd("ZADD") };
                cmd.arg(key);
                if !closed {
                    cmd.arg(0);
                }
                cmd.arg(member).query_async::<()>(&mut c).await
            })
            .await;
        if let Err(e) = r {
            tracing::warn!(room = %ch, closed, error = %e, "active-rooms index not updated; the next write of the room does it");
        }
    }

    pub async fn rooms_active(
        &self,
        after: Option<&ChannelName>,
        limit: usize,
    ) -> Result<Vec<(ChannelName, Room)>, EngineError> {
        let key = self.keys.rooms_active();
        let mut out = Vec::new();
        let mut from = after.map_or_else(|| "-".to_owned(), |a| format!("({a}"));
        while out.len() < limit {
            let page = (limit - out.len()).clamp(16, 256);
            let names: Vec<String> =
                self.redis.lex_page("rooms active", key.clone(), from.clone().into_bytes(), page).await?;
            let Some(last) = names.last() else { break };
            from = format!("({last}");
            let done = names.len() < page;
            let channels: Vec<ChannelName> = names.iter().filter_map(|n| ChannelName::new(n).ok()).collect();
            let rooms = futures_util::future::join_all(channels.iter().map(|ch| self.room(ch))).await;
            for (ch, room) in channels.into_iter().zip(rooms) {
                match room? {
                    // Closed for good: the entry is a leftover of a late add.
                    Some(room) if room.state == RoomStatus::Closed => self.index_room(&ch, true).await,
                    Some(room) if out.len() < limit => out.push((ch, room)),
                    // Missing: an entry of a create that never happened.
                    _ => {}
                }
            }
            if done {
                break;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_records_round_trip() {
        let room = Room::new("host".into(), serde_json::Map::new(), 1_000, 5);
        let json = serde_json::to_string(&room).unwrap();
        assert_eq!(parse_room(&json).unwrap(), room);
        assert!(parse_room("{").is_err());
    }
}
