//! The one place where a session applies a decoded command
//! ([`Command`], from its wire): a refusal closes, a Centrifugo command (valid
//! or not) goes to `session/centrifugo.rs`, and a Herald frame is charged to the frame
//! budget, ordered after the publishes before it, and handled here.

use futures_util::SinkExt;
use herald_proto::{close, ClientFrame, ErrorCode, OkFrame};

use super::requests::Asker;
use super::{pipeline, presence, Session, SessionEnd};
use crate::error::ApiError;
use crate::gateway::wire::Command;

impl Session {
    /// Apply one decoded command: every command of every wire goes
    /// through here.
    pub(super) async fn apply(&mut self, command: Command) -> Result<(), SessionEnd> {
        let frame = match command {
            Command::Refuse { reply, reason } => {
                if let Some(reply) = reply {
                    self.send_bytes(reply).await?;
                }
                return Err(SessionEnd::Close { code: close::BAD_REQUEST, reason, reconnect: false });
            }
            Command::Centrifugo { id, method } => {
                self.state.metrics.protocol_frame(self.wire.protocol());
                return self.apply_centrifugo(id, method).await;
            }
            Command::Invalid { id, error } => {
                self.state.metrics.protocol_frame(self.wire.protocol());
                return self.apply_invalid(id, error).await;
            }
            Command::Herald(frame) => frame,
        };
        self.state.metrics.protocol_frame(self.wire.protocol());
        // Acks that move the acked window are free: they are bounded by the
        // messages delivered. Every other frame, other acks included,
        // costs one frame of the budget (see `session/budget.rs`).
        let free =
            matches!(&frame, Ok(ClientFrame::Ack { channel, seq, .. }) if self.ack_moves(channel, *seq));
        if !free && !self.take_budget()? {
            let req = match &frame {
                Ok(f) => f.req(),
                Err(e) => e.req,
            };
            let err = ApiError::new(ErrorCode::RateLimited, "too many frames; slow down");
            return self.send_error(&err, req, None).await;
        }
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                let err = ApiError::new(e.code, e.message);
                return self.send_error(&err, e.req, None).await;
            }
        };
        if !matches!(frame, ClientFrame::Publish { .. }) {
            // Every earlier publish is answered first: a frame acts after
            // the publishes sent before it.
            Box::pin(self.settle_publishes()).await?;
        }
        match frame {
            ClientFrame::Subscribe { req, channel, since, client_id, info } => {
                let presence = presence::PresenceArgs { client_id, info };
                match self.subscribe(req, &channel, since, presence, Asker::Client).await {
                    Ok((ok, ended)) => {
                        self.send_bytes(ok.encode()).await?;
                        if ended {
                            // A closed room with nothing left to catch up.
                            self.end_subscription(&channel, "room_closed").await?;
                            self.ws.flush().await.map_err(|_| SessionEnd::Gone)?;
                        }
                        Ok(())
                    }
                    Err(e) => self.send_error(&e, req, Some(channel.as_str())).await,
                }
            }
            ClientFrame::Unsubscribe { req, channel } => {
                if self.unsubscribe(&channel).await {
                    let ok = OkFrame { req, channel: Some(channel.to_string()), ..Default::default() };
                    self.send_bytes(ok.encode()).await
                } else {
                    let err = ApiError::new(ErrorCode::NotSubscribed, "not subscribed to this channel");
                    self.send_error(&err, req, Some(channel.as_str())).await
                }
            }
            ClientFrame::Publish { req, channel, data, meta, idempotency_key } => {
                let publish = self.prepare_publish(&channel, data, meta, idempotency_key);
                self.queue_publish(pipeline::Queued { req, channel, publish });
                Ok(())
            }
            ClientFrame::Ping { req } => self.send_bytes(herald_proto::encode_pong(req)).await,
            ClientFrame::Ack { req, channel, seq } => match self.ack(&channel, seq).await {
                // No reply needed; one is sent when the client asked with `req`.
                Ok(()) if req.is_none() => Ok(()),
                Ok(()) => {
                    let ok = OkFrame { req, channel: Some(channel.to_string()), ..Default::default() };
                    self.send_bytes(ok.encode()).await
                }
                Err(e) => self.send_error(&e, req, Some(channel.as_str())).await,
            },
            ClientFrame::Presence { req, channel } => match Box::pin(self.presence_list(&channel)).await {
                Ok(ok) => self.send_bytes(OkFrame { req, ..ok }.encode()).await,
                Err(e) => self.send_error(&e, req, Some(channel.as_str())).await,
            },
        }
    }
}
