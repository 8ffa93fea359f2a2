//! The start of a Server-Sent Events stream (`gateway::sse`): its channels
//! are subscribed before the response is answered, so a refusal (a channel
//! the token does not allow, a position past the head, an unknown room) is
//! an HTTP status with a problem document, which stops a browser's
//! `EventSource` from retrying what can never work.

use bytes::Bytes;
use futures_util::SinkExt;
use herald_proto::{ErrorCode, OkFrame, Since};

use super::presence::PresenceArgs;
use super::requests::Asker;
use super::Session;
use crate::error::ApiError;

impl Session {
    /// Subscribe the stream's channels, each after its position (`None`:
    /// as a subscribe without `since`), and queue what opens the stream: per
    /// channel a `subscribed` event (the fields of a subscribe's `ok`),
    /// followed by `truncated` or `epoch_changed` when the resume says so.
    /// Each carries the stream's positions as its id, so a reconnect
    /// before any message resumes where delivery started. The first
    /// refusal is returned; dropping the session then undoes the rest.
    pub async fn start_sse(&mut self, starts: Vec<Option<Since>>) -> Result<(), ApiError> {
        let channels = self.wire.sse().expect("an SSE session").channels().to_vec();
        let mut opened = Vec::with_capacity(channels.len());
        for (channel, since) in channels.iter().zip(starts) {
            let (ok, ended) =
                Box::pin(self.subscribe(None, channel, since, PresenceArgs::default(), Asker::Client))
                    .await?;
            let next =
                self.chans.regs.subs.get(channel).and_then(|s| s.log.as_ref()).map(|l| l.delivery.next());
            if let (Some(epoch), Some(next)) = (ok.epoch.as_deref(), next) {
                let sse = self.wire.sse().expect("an SSE session");
                sse.set_position(channel, epoch, next.saturating_sub(1));
            }
            opened.push((ok, ended));
        }
        for (ok, ended) in opened {
            let sse = self.wire.sse().expect("an SSE session");
            let mut bytes = sse.positioned("subscribed", &ok.encode_subscribed());
            if ok.truncated == Some(true) {
                bytes.extend(sse.positioned("truncated", &signal("truncated", &ok)));
            }
            if ok.epoch_changed == Some(true) {
                bytes.extend(sse.positioned("epoch_changed", &signal("epoch_changed", &ok)));
            }
            self.queue(bytes).await?;
            if ended {
                let channel = ok.channel.as_deref().and_then(|c| herald_proto::ChannelName::new(c).ok());
                if let Some(channel) = channel {
                    self.end_subscription(&channel, "room_closed").await.map_err(|_| closed())?;
                }
            }
        }
        Ok(())
    }

    /// Queue bytes on the stream; they leave at the session's first flush.
    async fn queue(&mut self, bytes: Vec<u8>) -> Result<(), ApiError> {
        let frame = self.wire.frame(Bytes::from(bytes));
        self.ws.feed(frame).await.map_err(|_| closed())
    }
}

/// `{"type":"truncated"|"epoch_changed","channel","epoch","first","head"}`:
/// the resume could not start where the position said (see docs/sse.md).
fn signal(kind: &str, ok: &OkFrame) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "type": kind,
        "channel": ok.channel,
        "epoch": ok.epoch,
        "first": ok.first,
        "head": ok.head,
    }))
    .expect("a JSON object serialises")
}

fn closed() -> ApiError {
    ApiError::new(ErrorCode::Internal, "the stream closed before it started")
}
