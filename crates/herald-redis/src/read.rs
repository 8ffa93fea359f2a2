//! Reading a channel: its position and a page of its log, in one snapshot
//! (the `READ` script), for `Log::read`, `Log::position` and the fan-out's
//! repairs.

use std::sync::Arc;

use herald_core::{EngineError, Epoch, Message, Position, Seq};
use herald_proto::ChannelName;

use crate::scripts::Read;
use crate::state::{new_epoch, EngineState};

/// Largest page one read returns, whatever the caller asks for.
const MAX_READ: usize = 10_000;

/// A page as read by the `READ` script.
pub(crate) struct RawPage {
    pub position: Position,
    pub messages: Vec<Arc<Message>>,
}

impl EngineState {
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
        let args = Read {
            meta: self.keys.meta(ch),
            log: self.keys.log(ch),
            epoch: new_epoch(),
            after,
            limit: limit.min(MAX_READ),
        };
        let reply = if fail_fast {
            self.redis.run("read", &args).await
        } else {
            self.redis.run_unchecked("read", &args).await
        };
        let mut r = self.failed(reply)?.fields("reply")?;
        let epoch = Epoch::new(r.string("epoch")?);
        let head = r.int("head")?;
        let first = r.int("first")?;
        let lost = r.flag("lost")?;
        let entries = r.fields("entries")?;
        let closed = r.flag("closed")?;
        // The closing message is the head of a closed channel.
        let closes_at = closed.then_some(head);
        let messages = entries.map(|e| e.message(ch, &epoch, closes_at)).collect::<Result<Vec<_>, _>>()?;
        if lost {
            self.note_lost_meta(ch, epoch.as_str());
        }
        Ok(RawPage { position: Position { epoch, first, head, closed }, messages })
    }
}
