//! Acknowledgement cursors: per subscriber and channel, the highest seq
//! acknowledged; monotonic, never past the head.

use std::sync::Arc;

use async_trait::async_trait;
use herald_proto::ChannelName;

use super::{EngineError, Seq, SubscriberId};

/// A subscriber's cursor on one channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CursorState {
    /// The highest seq acknowledged: every seq `<= seq` counts as delivered.
    pub seq: Seq,
    /// When the cursor last advanced (server time, ms since the Unix epoch).
    /// An ack that does not advance the cursor leaves it unchanged.
    pub acked_at_ms: u64,
}

/// One of a user's cursors, as listed by [`Cursors::user_cursors`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserCursor {
    pub channel: ChannelName,
    pub device: Option<Arc<str>>,
    pub cursor: CursorState,
}

/// An acknowledgement of every seq `<= seq` of `channel` by `subscriber`:
/// see [`Cursors::cursor_ack`].
#[derive(Debug, Clone)]
pub struct CursorAck {
    pub channel: ChannelName,
    pub subscriber: SubscriberId,
    pub seq: Seq,
}

/// Why a [`Cursors::cursor_ack`] was refused.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum AckError {
    /// `seq` is past the channel's head: it acknowledges messages that do
    /// not exist (yet), so nothing was stored. The server answers the client
    /// with an error frame; it is never retried.
    #[error("ack of seq {seq} is beyond the channel head {head}")]
    BeyondHead { seq: Seq, head: Seq },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Cursors of acked subscribers (see the [module docs](super): monotonic,
/// never past the head, an `Ok` ack visible to every later read).
#[async_trait]
pub trait Cursors: Send + Sync + 'static {
    /// Acknowledge every seq `<= seq` of `channel` for `subscriber`
    /// (an engine takes the owned request, callers use [`ack`](Cursors::ack)): the
    /// stored cursor becomes `max(stored, seq)` and the resulting cursor is
    /// returned. Cumulative, monotonic (a lower or equal `seq` changes
    /// nothing, not even `acked_at_ms`) and idempotent. `seq = 0` is valid:
    /// it creates a cursor at 0 if there is none.
    ///
    /// `seq` above the channel's head is refused with
    /// [`AckError::BeyondHead`] and nothing is stored: clamping it to the
    /// head would acknowledge messages the subscriber never received.
    ///
    /// Durability: an ack costs no fsync of its own. When `Ok` is returned
    /// the cursor has reached the engine's store as far as the engine's
    /// documented ack setting promises (at least: it survives a crash of
    /// the Herald process). An ack lost to a machine crash only causes
    /// redelivery, never loss. Concurrent acks of one cursor are applied in
    /// some order; the result is their maximum.
    async fn cursor_ack(&self, ack: CursorAck) -> Result<CursorState, AckError>;

    /// [`cursor_ack`](Cursors::cursor_ack) from borrowed parts.
    async fn ack(
        &self,
        channel: &ChannelName,
        subscriber: &SubscriberId,
        seq: Seq,
    ) -> Result<CursorState, AckError> {
        self.cursor_ack(CursorAck { channel: channel.clone(), subscriber: subscriber.clone(), seq }).await
    }

    /// The subscriber's cursor on `channel`; `None` before its first ack.
    async fn cursor(
        &self,
        channel: &ChannelName,
        subscriber: &SubscriberId,
    ) -> Result<Option<CursorState>, EngineError>;

    /// Up to `limit` cursors of `channel` (delivery receipts), one per
    /// subscriber, in an engine-defined order.
    async fn cursors(
        &self,
        channel: &ChannelName,
        limit: usize,
    ) -> Result<Vec<(SubscriberId, CursorState)>, EngineError>;

    /// Up to `limit` cursors of `user`, across its devices and channels (the
    /// user's inbox), in an engine-defined order. Cursors of other users are
    /// never listed, whatever their names share with `user`. A `user` that
    /// is not a valid [`SubscriberId`] user has none.
    async fn user_cursors(&self, user: &str, limit: usize) -> Result<Vec<UserCursor>, EngineError>;
}
