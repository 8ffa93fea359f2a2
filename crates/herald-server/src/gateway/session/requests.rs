//! Request handlers of a session: subscribe (durable and acked), ack,
//! redelivery timers and publish (presence: `session/presence.rs`). Split from `session.rs` for size; same type, same invariants.

use herald_core::delivery::{self, AckOpts, AckRefused, AckStep, AckedStart, Expiry, Start, Subscription};
use herald_core::{AckError, Delivery, NamespaceOptions, RoomStatus, Seq, SubscriberId};
use herald_proto::{ChannelName, ErrorCode, OkFrame};

use super::presence::PresenceArgs;
use super::{ChannelTimers, LogDelivery, Session, SessionEnd, Sub};
use crate::error::ApiError;
use crate::gateway::wire::Acks;
use crate::publish::{fingerprint, validate_idempotency_key, Publish, ScopedKey};
use crate::rooms;

/// Who asked for a subscription.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Asker {
    /// The client, with a subscribe command: its permissions are checked.
    Client,
    /// The server, on the client's behalf (server-side subscriptions).
    Server,
}

impl Session {
    /// Subscribe; the flag says the channel is a closed room with nothing
    /// left to deliver (the caller ends the subscription after the reply).
    /// A subscription the server makes (`by`) was granted where it was
    /// decided (the token, the connect proxy, the personal channel): the
    /// token's patterns and the subscribe proxy are not asked again.
    #[tracing::instrument(target = "herald::trace", level = "trace", name = "herald.subscribe", skip_all, fields(channel = %channel))]
    pub(super) async fn subscribe(
        &mut self,
        req: Option<u64>,
        channel: &ChannelName,
        since: Option<herald_proto::Since>,
        presence: PresenceArgs,
        by: Asker,
    ) -> Result<(OkFrame, bool), ApiError> {
        let state = self.state.clone();
        let ns = state.config().namespaces.resolve(channel)?;
        if by == Asker::Client && !self.identity.may_subscribe(channel, ns) {
            return Err(ApiError::new(ErrorCode::Forbidden, "the token does not allow this channel"));
        }
        if self.chans.regs.subs.contains_key(channel) {
            return Err(ApiError::new(ErrorCode::AlreadySubscribed, "already subscribed on this connection"));
        }
        if by == Asker::Client {
            // The backend's say, after the token's (proxies.rs).
            crate::integration::proxies::subscribe(
                &state,
                &self.identity.sub,
                self.identity.device.as_deref(),
                channel,
            )
            .await?;
        }
        if self.chans.regs.subs.len() >= state.config().websocket.max_subscriptions {
            return Err(ApiError::new(
                ErrorCode::TooManySubscriptions,
                format!(
                    "at most {} subscriptions per connection",
                    state.config().websocket.max_subscriptions
                ),
            ));
        }
        let room_closed = if ns.room {
            match state.engine.room(channel).await? {
                None => return Err(rooms::no_such_room()),
                Some(room) if room.is_removed(&self.identity.sub) => {
                    return Err(ApiError::new(ErrorCode::Forbidden, "removed from this room"))
                }
                Some(room) => room.state == RoomStatus::Closed,
            }
        } else {
            false
        };
        // Register before reading the position: anything committed after
        // this point reaches the outbox, anything before is in the log.
        state.hub.add(channel, self.handle.clone());
        state.metrics.subscriptions.inc();
        let durable = ns.is_durable();
        self.chans.regs.subs.insert(
            channel.clone(),
            Sub {
                log: durable.then(|| LogDelivery { delivery: Subscription::starting(), subscriber: None }),
                presence: None,
            },
        );
        let mut result = self.start_subscription(req, channel, since, ns).await;
        if let Ok(ok) = &mut result {
            if ns.presence && !room_closed && self.wire.joins_presence() {
                if let Err(e) = self.join_presence(channel, ok, presence).await {
                    result = Err(e);
                }
            }
        }
        match result {
            Ok(ok) => {
                let idle = self
                    .chans
                    .regs
                    .subs
                    .get(channel)
                    .and_then(|s| s.log.as_ref())
                    .is_some_and(|l| l.delivery.is_live());
                Ok((ok, room_closed && idle))
            }
            Err(e) => {
                self.chans.regs.remove(channel);
                Err(e)
            }
        }
    }

    async fn start_subscription(
        &mut self,
        req: Option<u64>,
        channel: &ChannelName,
        since: Option<herald_proto::Since>,
        ns: &NamespaceOptions,
    ) -> Result<OkFrame, ApiError> {
        // Once per subscription, balanced by the `unwatch` of its release.
        self.state.engine.watch(channel).await?;
        let mut ok = OkFrame { req, channel: Some(channel.to_string()), ..Default::default() };
        if !ns.is_durable() {
            return Ok(ok);
        }
        if ns.delivery == Delivery::Acked {
            return self.start_acked(ok, channel, since, ns).await;
        }
        let pos = self.state.engine.position(channel).await?;
        let start = delivery::resolve(&pos, since.as_ref(), None)
            .map_err(|e| ApiError::new(ErrorCode::BadRequest, e.to_string()))?;
        self.begin_delivery(&mut ok, channel, &start, None, None);
        Ok(ok)
    }

    /// Start delivering a subscribed durable channel from a resolved start:
    /// install its state machine, queue catch-up if the log has anything
    /// from the start on, and fill the start into the `ok` reply.
    pub(super) fn begin_delivery(
        &mut self,
        ok: &mut OkFrame,
        channel: &ChannelName,
        start: &Start,
        subscriber: Option<SubscriberId>,
        opts: Option<AckOpts>,
    ) {
        let subscriber = subscriber.map(Box::new);
        let delivery = Subscription::start(start, opts);
        if delivery.wants_read() {
            self.chans.catchup.push_back(channel.clone());
        }
        if let Some(log) = self.chans.regs.subs.get_mut(channel).and_then(|s| s.log.as_mut()) {
            *log = LogDelivery { delivery, subscriber };
        }
        ok.epoch = Some(start.epoch.to_string());
        ok.first = Some(start.first);
        ok.head = Some(start.head);
        ok.truncated = Some(start.truncated);
        ok.epoch_changed = start.epoch_changed.then_some(true);
    }

    /// Subscribe on an acked channel: start after the larger of the stored
    /// cursor and `since` (the offline inbox); a subscriber with no cursor
    /// starts where the namespace's `start` says.
    async fn start_acked(
        &mut self,
        mut ok: OkFrame,
        channel: &ChannelName,
        since: Option<herald_proto::Since>,
        ns: &NamespaceOptions,
    ) -> Result<OkFrame, ApiError> {
        let Ok(subscriber) = SubscriberId::new(self.identity.sub.clone(), self.identity.device.clone())
        else {
            return Err(ApiError::new(
                ErrorCode::BadRequest,
                "acked channels need a valid user and device id",
            ));
        };
        let state = self.state.clone();
        let pos = state.engine.position(channel).await?;
        let stored = state.engine.cursor(channel, &subscriber).await?.map(|c| c.seq);
        let start = delivery::resolve(
            &pos,
            since.as_ref(),
            Some(AckedStart { stored, start: ns.new_subscriber_start }),
        )
        .map_err(|e| ApiError::new(ErrorCode::BadRequest, e.to_string()))?;
        if start.truncated {
            // Retention removed messages this subscriber never acked.
            state.metrics.acked_truncated.inc_by(start.skipped);
        }
        // Acked by the recover offset (Centrifugo clients send no acks): a
        // resubscribe acknowledges everything up to its offset, and
        // delivery has no window and no redelivery timers
        // (docs/centrifugo.md).
        let opts = match self.wire.acks() {
            Acks::RecoverOffset => {
                let claimed = since.filter(|_| !start.epoch_changed).map_or(0, |s| s.seq);
                if claimed > start.stored {
                    state.engine.ack(channel, &subscriber, claimed).await.map_err(ack_error)?;
                    state.metrics.acks.inc();
                }
                None
            }
            Acks::Never => None,
            Acks::Frames => Some(AckOpts::from(ns)),
        };
        self.begin_delivery(&mut ok, channel, &start, Some(subscriber), opts);
        ok.cursor = Some(start.stored);
        ok.unread = Some(start.unread());
        Ok(ok)
    }

    /// A cumulative ack: stored in the engine (batched there, no fsync per
    /// ack), then the window moves and paused delivery resumes.
    pub(super) async fn ack(&mut self, channel: &ChannelName, seq: Seq) -> Result<(), ApiError> {
        let Some(log) = self.chans.regs.subs.get(channel).map(|s| s.log.as_ref()) else {
            return Err(ApiError::new(
                ErrorCode::NotSubscribed,
                "ack on a channel this connection is not subscribed to",
            ));
        };
        let step = log.map_or(Err(AckRefused::NotAcked), |l| l.delivery.check_ack(seq));
        let seq = match step {
            Ok(AckStep::Stored) => return Ok(()), // idempotent
            Ok(AckStep::Store { seq }) => seq,
            Err(AckRefused::NotAcked) => {
                return Err(ApiError::new(
                    ErrorCode::NotSupported,
                    "acks are only for channels with delivery = \"acked\"",
                ))
            }
            Err(AckRefused::NotDelivered { .. }) => {
                return Err(ApiError::new(
                    ErrorCode::BadRequest,
                    format!("seq {seq} has not been delivered on this subscription yet"),
                ))
            }
        };
        let subscriber = log
            .and_then(|l| l.subscriber.as_deref())
            .expect("an acked subscription has its subscriber")
            .clone();
        let state = self.state.clone();
        let cursor = state.engine.ack(channel, &subscriber, seq).await.map_err(ack_error)?;
        state.metrics.acks.inc();
        // Same task: the subscription cannot have gone during the await.
        if let Some(log) = self.chans.regs.subs.get_mut(channel).and_then(|s| s.log.as_mut()) {
            let mut timers = ChannelTimers { queue: &mut self.chans.timers, channel };
            if log.delivery.on_acked(seq, cursor.seq, &mut timers) && !self.chans.catchup.contains(channel) {
                // The window opened: resume from the log.
                self.chans.catchup.push_back(channel.clone());
            }
        }
        Ok(())
    }

    /// A redelivery timer fired.
    pub(super) async fn on_timer(&mut self, (channel, seq): (ChannelName, Seq)) -> Result<(), SessionEnd> {
        let Some(log) = self.chans.regs.subs.get_mut(&channel).and_then(|s| s.log.as_mut()) else {
            return Ok(());
        };
        match log
            .delivery
            .on_timer(seq, &mut ChannelTimers { queue: &mut self.chans.timers, channel: &channel })
        {
            Expiry::Ignore => Ok(()),
            Expiry::Stale => {
                self.state.metrics.acked_stale.inc();
                tracing::debug!(conn = self.handle.id, channel = %channel, seq, "acked subscription stale");
                Ok(())
            }
            Expiry::Redeliver { attempt } => {
                let page = match self.state.engine.read(&channel, seq - 1, 1).await {
                    Ok(page) => page,
                    Err(e) => {
                        // The next expiry tries again.
                        tracing::warn!(channel = %channel, error = %e, "redelivery read failed");
                        return Ok(());
                    }
                };
                if let Some(msg) = page.messages.first().filter(|m| m.seq == Some(seq)) {
                    self.send_bytes(herald_proto::mark_redelivered(&msg.frame, attempt)).await?;
                    self.state.metrics.redeliveries.inc();
                }
                Ok(())
            }
        }
    }

    /// A publish frame, checked for what the session knows (namespace,
    /// permissions, the idempotency key and its scope); the rest is checked
    /// with the batch it goes to the engine in (`session/pipeline.rs`).
    pub(super) fn prepare_publish(
        &self,
        channel: &ChannelName,
        data: Box<serde_json::value::RawValue>,
        meta: Option<herald_proto::Meta>,
        idempotency_key: Option<String>,
    ) -> Result<Publish, ApiError> {
        let ns = self.state.config().namespaces.resolve(channel)?;
        if !ns.client_publish {
            return Err(ApiError::new(ErrorCode::Forbidden, "clients may not publish to this namespace"));
        }
        if !self.identity.may_publish(channel) {
            return Err(ApiError::new(ErrorCode::Forbidden, "the token does not allow publishing here"));
        }
        let dedup = match &idempotency_key {
            Some(key) => {
                validate_idempotency_key(key)?;
                // Scoped per user (the token's `sub`); compared as an HTTP
                // publish to one channel is.
                let scope = format!("client:{}", self.identity.sub);
                let fp = fingerprint(std::slice::from_ref(channel), &data, meta.as_ref());
                Some((ScopedKey::new(&scope, key).anchor(), fp))
            }
            None => None,
        };
        Ok(Publish { channel: channel.clone(), data, meta, dedup })
    }
}

fn ack_error(e: AckError) -> ApiError {
    match e {
        AckError::BeyondHead { .. } => ApiError::new(ErrorCode::BadRequest, e.to_string()),
        AckError::Engine(e) => e.into(),
    }
}
