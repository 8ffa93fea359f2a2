//! Subscriptions the server makes for the client: the personal channel
//! (`[personal]`) on every endpoint, and on the Centrifugo endpoint the
//! `channels` of the token or the connect proxy (`session/centrifugo.rs`).
//! They are ordinary subscriptions of the session (delivery, catch-up,
//! acks, presence as any other), granted where they were decided, so the
//! token's patterns and the subscribe proxy are not asked again.

use herald_proto::ChannelName;

use super::presence::PresenceArgs;
use super::requests::Asker;
use super::{Session, SessionEnd};

impl Session {
    /// This connection's personal channel, `{personal.namespace}:{user}`,
    /// if `personal.subscribe` is on and the user id can be a channel's
    /// (a user id outside the channel alphabet has none: logged).
    pub(super) fn personal_channel(&self) -> Option<ChannelName> {
        let p = &self.state.config().personal;
        if !p.subscribe {
            return None;
        }
        match ChannelName::new(&format!("{}:{}", p.namespace, self.identity.sub)) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::debug!(error = %e, "no personal channel: the user id is not a channel name");
                None
            }
        }
    }

    /// On a connection whose identity is known at the upgrade (`/ws`):
    /// subscribe the personal channel and tell the client with a
    /// `subscribed` frame. A refusal (the engine unavailable, say) is
    /// logged and leaves the connection up without it.
    pub(super) async fn start_personal(&mut self) -> Result<(), SessionEnd> {
        let Some(channel) = self.personal_channel() else { return Ok(()) };
        match self.subscribe(None, &channel, None, PresenceArgs::default(), Asker::Server).await {
            Ok((ok, ended)) => {
                self.send_bytes(ok.encode_subscribed()).await?;
                if ended {
                    self.end_subscription(&channel, "room_closed").await?;
                }
                Ok(())
            }
            Err(e) => {
                tracing::warn!(channel = %channel, code = e.code.as_str(), detail = %e.detail, "personal channel not subscribed");
                Ok(())
            }
        }
    }
}
