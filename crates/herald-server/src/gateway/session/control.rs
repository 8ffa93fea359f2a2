//! The backend's orders to this session (`crate::control`): subscribe or
//! unsubscribe a channel and tell the client on its wire, and the
//! registration of who the session serves, which the orders find it by.

use herald_proto::ErrorCode;

use super::presence::PresenceArgs;
use super::requests::Asker;
use super::{Session, SessionEnd};
use crate::error::ApiError;
use crate::hub::{Order, SessionInfo};

/// Why the server ended a subscription the backend removed.
const UNSUBSCRIBED: &str = "unsubscribed by the server";

impl Session {
    /// Register who this session serves, once its identity is known and
    /// [`admit`]ted: the backend's orders find it by that.
    pub(super) fn register(&self) {
        let info = SessionInfo {
            user: self.identity.sub.clone(),
            device: self.identity.device.clone(),
            protocol: self.wire.protocol().label(),
            connected_at_ms: crate::control::now_ms(),
            remote: self.remote.clone(),
            iat: self.identity.iat,
        };
        self.state.sessions.identify(self.handle.id, info);
    }

    pub(super) async fn on_order(&mut self, order: Order) -> Result<(), SessionEnd> {
        match order {
            Order::Subscribe { channel, since } => {
                // A retried order finds the channel subscribed: one effect.
                if self.chans.regs.subs.contains_key(&channel) {
                    return Ok(());
                }
                let from = since.as_ref().map(|s| s.seq);
                match self.subscribe(None, &channel, since, PresenceArgs::default(), Asker::Server).await {
                    Ok((mut ok, ended)) => {
                        let start = from.or(ok.head).unwrap_or(0);
                        // Durable, not acked: the client starts after `since`.
                        if ok.epoch.is_some() && ok.cursor.is_none() {
                            ok.since = from;
                        }
                        self.send_bytes(self.wire.subscribed(&channel, &ok, start)).await?;
                        if ended {
                            self.end_subscription(&channel, "room_closed").await?;
                        }
                    }
                    Err(e) => tracing::info!(
                        conn = self.handle.id,
                        channel = %channel,
                        code = e.code.as_str(),
                        detail = %e.detail,
                        "server-side subscribe refused"
                    ),
                }
            }
            Order::Unsubscribe { channel } => {
                if self.unsubscribe(&channel).await {
                    self.send_bytes(self.wire.unsubscribed(&channel, UNSUBSCRIBED)).await?;
                }
            }
        }
        Ok(())
    }
}

/// The engine's ban and revocation checks for `identity`, before an
/// upgrade (`/ws`) or a `connect` (Centrifugo).
pub(crate) async fn admit(
    state: &crate::state::AppState,
    identity: &crate::auth::Identity,
) -> Result<(), ApiError> {
    let now = crate::control::now_ms();
    let held = state.engine.admission(&identity.sub, identity.device.as_deref(), now).await?;
    if let Some(until) = held.banned_until_ms {
        let mut e =
            ApiError::new(ErrorCode::Banned, format!("banned until {until} (ms since the Unix epoch)"));
        e.retry_after = Some(until.saturating_sub(now).div_ceil(1000));
        return Err(e);
    }
    if let (Some(before), Some(iat)) = (held.revoked_before_ms, identity.iat) {
        if iat.saturating_mul(1000) < before {
            return Err(ApiError::new(
                ErrorCode::TokenExpired,
                "token revoked: issued before the user's revocation",
            ));
        }
    }
    Ok(())
}
