//! Requests on the current connection and their replies: `subscribe`,
//! `unsubscribe` and `publish` are encoded through `herald_proto::OutFrame`
//! (one definition of the wire shape, shared with the server's parser);
//! `ok`/`error`/`pong` are matched to them by `req`; `disconnect` and
//! `unsubscribed` are dispatched here too.

use herald_proto::{ChannelName, ErrorCode, MessageView, OutFrame};
use std::sync::atomic::Ordering;

use tokio::sync::{mpsc, oneshot};

use super::queue::Sub;
use super::{Disconnect, SessionEnd, Worker};
use crate::command::{PublishCmd, ServerSubscribed};
use crate::error::{parse_error_code, view_code};
use crate::event::{Event, PublishReply, SubscribeInfo};
use crate::resume::ResumePoint;
use crate::resume::Subscribed;
use crate::{ClientError, Connection};

/// A request sent on the current connection, by `req`. Cleared when the
/// connection ends.
pub(super) enum Pending {
    Subscribe { channel: ChannelName, id: u64 },
    Unsubscribe,
    Publish(oneshot::Sender<Result<PublishReply, ClientError>>),
}

impl Worker {
    pub(super) fn alloc_req(&mut self) -> u64 {
        let req = self.next_req;
        self.next_req += 1;
        req
    }

    pub(super) async fn send_subscribe(
        &mut self,
        conn: &mut Connection,
        channel: &str,
    ) -> Result<(), ClientError> {
        let req = self.alloc_req();
        let Some(sub) = self.subs.get_mut(channel) else { return Ok(()) };
        sub.confirmed = false;
        let client_id = Some(self.opts.client_id.as_str());
        let frame =
            OutFrame::Subscribe { req: Some(req), channel, since: sub.resume.since(), client_id, info: None };
        let text = frame.encode();
        self.pending.insert(req, Pending::Subscribe { channel: sub.channel.clone(), id: sub.id });
        conn.send_text(text).await
    }

    pub(super) async fn send_unsubscribe(
        &mut self,
        conn: &mut Connection,
        channel: &str,
    ) -> Result<(), ClientError> {
        let req = self.alloc_req();
        let text = OutFrame::Unsubscribe { req: Some(req), channel }.encode();
        self.pending.insert(req, Pending::Unsubscribe);
        conn.send_text(text).await
    }

    pub(super) async fn send_publish(
        &mut self,
        conn: &mut Connection,
        cmd: PublishCmd,
    ) -> Result<(), ClientError> {
        let PublishCmd { channel, data, meta, idempotency_key, reply } = cmd;
        let req = self.alloc_req();
        let text = OutFrame::Publish {
            req: Some(req),
            channel: &channel,
            data: &data,
            meta: meta.as_ref(),
            idempotency_key: idempotency_key.as_deref(),
        }
        .encode();
        // Registered before sending: if the send fails, the session ends and
        // `fail_pending` answers it with `ConnectionLost` (it may have
        // reached the server).
        self.pending.insert(req, Pending::Publish(reply));
        conn.send_text(text).await
    }

    /// Handle one text frame. `Some` ends the session.
    pub(super) async fn on_frame(
        &mut self,
        conn: &mut Connection,
        view: MessageView,
        disconnect: &mut Option<Disconnect>,
    ) -> Option<SessionEnd> {
        match view.kind.as_str() {
            "message" | "room" => {
                if let Some(stalled) = self.on_message(view) {
                    self.finish_delivery(conn, stalled).await;
                }
            }
            "ok" | "error" | "pong" => {
                let pending = view.req.and_then(|req| self.pending.remove(&req));
                match pending {
                    Some(Pending::Subscribe { channel, id }) => {
                        return self.on_subscribe_reply(conn, &channel, id, view).await;
                    }
                    Some(Pending::Publish(reply)) => {
                        let _ = reply.send(publish_reply(&view));
                    }
                    Some(Pending::Unsubscribe) => {}
                    None if view.kind == "error" => {
                        tracing::warn!(
                            code = ?view.code, message = ?view.message, channel = ?view.channel,
                            "herald server error not tied to a request"
                        );
                    }
                    None => {}
                }
            }
            "disconnect" => {
                *disconnect = Some(Disconnect {
                    code: view
                        .code
                        .as_ref()
                        .and_then(|c| c.as_u64())
                        .and_then(|c| u16::try_from(c).ok())
                        .unwrap_or(0),
                    reason: view.reason.unwrap_or_default(),
                    reconnect: view.reconnect.unwrap_or(true),
                });
            }
            "subscribed" => self.on_server_subscribed(conn, view).await,
            "unsubscribed" => {
                if let Some(channel) = view.channel.as_deref().and_then(|c| ChannelName::new(c).ok()) {
                    let reason = view.reason.unwrap_or_default();
                    let ev = Event::Unsubscribed { channel: channel.clone(), reason };
                    self.deliver(conn, channel.as_str(), Ok(ev)).await;
                    // Not resumed on reconnect.
                    self.subs.remove(channel.as_str());
                }
            }
            // Frames this client does not use yet (presence join/leave, ...).
            _ => {}
        }
        None
    }

    pub(super) async fn on_subscribe_reply(
        &mut self,
        conn: &mut Connection,
        channel: &ChannelName,
        id: u64,
        view: MessageView,
    ) -> Option<SessionEnd> {
        let Some(sub) = self.subs.get_mut(channel.as_str()).filter(|s| s.id == id) else {
            // Unsubscribed (or replaced) while the subscribe was in flight.
            if view.kind == "ok" {
                let _ = self.send_unsubscribe(conn, channel.as_str()).await;
            }
            return None;
        };
        if view.kind != "ok" {
            let error = ClientError::from_error_frame(&view);
            if let Some(initial) = sub.initial.take() {
                // The first subscribe fails straight to the caller.
                let _ = initial.send(Err(error));
                self.subs.remove(channel.as_str());
                return None;
            }
            if view_code(&view).as_deref().and_then(parse_error_code).is_some_and(is_transient) {
                // Resume later from the same point.
                return Some(SessionEnd::Retry { error, healthy: false });
            }
            tracing::debug!(%channel, %error, "herald resubscribe refused; ending the subscription");
            self.deliver(conn, channel.as_str(), Err(error)).await;
            self.subs.remove(channel.as_str());
            return None;
        }

        let reset = sub.resume.on_subscribed(&Subscribed {
            epoch: view.epoch.as_deref(),
            first: view.first,
            head: view.head,
            truncated: view.truncated.unwrap_or(false),
            epoch_changed: view.epoch_changed.unwrap_or(false),
        });
        sub.confirmed = true;
        if let Some(initial) = sub.initial.take() {
            let info = SubscribeInfo {
                channel: channel.clone(),
                epoch: view.epoch.clone(),
                first: view.first,
                head: view.head,
                truncated: reset.truncated,
                epoch_changed: reset.epoch_changed,
            };
            if initial.send(Ok(info)).is_err() {
                // The caller stopped waiting (timeout or cancel).
                self.subs.remove(channel.as_str());
                let _ = self.send_unsubscribe(conn, channel.as_str()).await;
                return None;
            }
        }
        if reset.any() {
            let ev = Event::Reset {
                channel: channel.clone(),
                truncated: reset.truncated,
                epoch_changed: reset.epoch_changed,
                epoch: view.epoch.unwrap_or_default(),
                first: view.first.unwrap_or(0),
                head: view.head.unwrap_or(0),
            };
            self.deliver(conn, channel.as_str(), Ok(ev)).await;
        }
        None
    }

    /// A `subscribed` frame: a subscription the server made. Known from an
    /// earlier connection, it continues (its resume point judges what
    /// comes); new, it goes to the application when it takes them
    /// (`server_subscriptions`), else it is declined with an unsubscribe.
    async fn on_server_subscribed(&mut self, conn: &mut Connection, view: MessageView) {
        let Some(channel) = view.channel.as_deref().and_then(|c| ChannelName::new(c).ok()) else { return };
        let subscribed = Subscribed {
            epoch: view.epoch.as_deref(),
            first: view.first,
            head: view.head,
            truncated: view.truncated.unwrap_or(false),
            epoch_changed: view.epoch_changed.unwrap_or(false),
        };
        if let Some(sub) = self.subs.get_mut(channel.as_str()).filter(|s| s.server_side) {
            sub.resume.on_subscribed(&subscribed);
            sub.confirmed = true;
            return;
        }
        let taken =
            self.server_subs.as_ref().filter(|tx| !tx.is_closed()).and_then(|tx| tx.try_reserve().ok());
        let Some(slot) = taken.filter(|_| !self.subs.contains_key(channel.as_str())) else {
            tracing::debug!(%channel, "declining a server-made subscription");
            let _ = self.send_unsubscribe(conn, channel.as_str()).await;
            return;
        };
        let (events_tx, events_rx) = mpsc::channel(self.opts.event_capacity.max(1));
        let id = self.shared.next_sub_id.fetch_add(1, Ordering::Relaxed);
        // Acked: delivery starts after the device's cursor, not the head;
        // made from a position (`since`): after it.
        let start = view.cursor.or(view.since);
        let mut resume = ResumePoint::new(start.zip(view.epoch.clone()));
        resume.on_subscribed(&subscribed);
        let info = SubscribeInfo {
            channel: channel.clone(),
            epoch: view.epoch.clone(),
            first: view.first,
            head: view.head,
            truncated: false,
            epoch_changed: false,
        };
        let sub = Sub {
            id,
            channel: channel.clone(),
            events_tx,
            resume,
            initial: None,
            confirmed: true,
            server_side: true,
        };
        self.subs.insert(channel.as_str().into(), sub);
        slot.send(ServerSubscribed { id, info, events_rx });
    }

    /// Answer requests of the ended connection. Subscribes are not lost:
    /// they stay in `subs` and are sent again on the next connection.
    pub(super) fn fail_pending(&mut self, err: &ClientError) {
        for (_, p) in self.pending.drain() {
            if let Pending::Publish(reply) = p {
                let _ = reply.send(Err(err.clone()));
            }
        }
    }
}

fn publish_reply(view: &MessageView) -> Result<PublishReply, ClientError> {
    if view.kind != "ok" {
        return Err(ClientError::from_error_frame(view));
    }
    Ok(PublishReply {
        channel: view.channel.clone().unwrap_or_default(),
        seq: view.seq,
        id: view.id.clone().unwrap_or_default(),
        duplicate: view.duplicate.unwrap_or(false),
    })
}

/// Server-side conditions that pass: worth retrying the same request later.
fn is_transient(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::Unavailable
            | ErrorCode::ShuttingDown
            | ErrorCode::Internal
            | ErrorCode::RateLimited
            | ErrorCode::TooManyConnections
    )
}
