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

use herald_core::{EngineError, Room, RoomStatus, RoomWrite, RoomWritten};
use herald_proto::ChannelName;

use crate::frame::FrameTemplate;
use crate::scripts::{self, OrEmpty};
use crate::state::{new_id, EngineState};

fn malformed(what: impl std::fmt::Display) -> EngineError {
    EngineError::Unavailable(format!("redis room: malformed {what}"))
}

fn parse_room(record: &str) -> Result<Room, EngineError> {
    serde_json::from_str(record).map_err(|e| malformed(format_args!("record ({e})")))
}

impl EngineState {
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
        self.refuse_when_closing()?;
        let RoomWrite { expected_version, room, event } = write;
        let ch = event.channel.clone();
        let closing = room.state == RoomStatus::Closed;
        // The event is durable, closes exactly when closing, and has no
        // dedup (the version check makes a retried write a conflict), as
        // the contract shapes it, whatever the caller set.
        let id = new_id();
        let tpl = FrameTemplate::new(event.kind, &ch, true, &id, &event.data, event.meta.as_ref());
        let record = serde_json::to_string(&room).expect("rooms serialise");
        let k = &self.keys;
        let args = scripts::RoomWrite {
            meta: k.meta(&ch),
            log: k.log(&ch),
            room: k.room(&ch),
            leases: k.leases(&ch),
            expected_version: OrEmpty(expected_version),
            version: room.version,
            record: &record,
            closing,
            event: self.event(&ch, &tpl, &id, &event.retention),
        };
        let mut r = self.run("room write", &args).await?.fields("reply")?;
        match r.status()?.as_str() {
            "conflict" => {
                self.counters.room_conflicts.bump();
                let current = r.string("current")?;
                let current = if current.is_empty() { None } else { Some(parse_room(&current)?) };
                Ok(RoomWritten::Conflict { current })
            }
            "closed" => Err(self.refuse_closed()),
            "ok" => {
                let receipt = self.receipt(&ch, &id, r.appended()?);
                self.counters.room_writes.bump();
                self.counters.appends.bump();
                self.index_room(&ch, closing).await;
                Ok(RoomWritten::Written { room, receipt })
            }
            _ => Err(r.unexpected()),
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
