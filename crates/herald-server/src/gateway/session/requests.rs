//! Request handlers of a session: subscribe (durable and acked), ack,
//! redelivery timers and publish. Split from `session.rs` for size; same type, same invariants.

use herald_core::delivery::{self, AckOpts, AckRefused, AckStep, AckedStart, Expiry, Start, Subscription};
use herald_core::{
    AckError, Delivery, EngineError, Member, NamespaceOptions, Renewed, RoomStatus, Seq, SubscriberId,
};
use herald_proto::{ChannelName, ErrorCode, OkFrame};
use serde_json::value::RawValue;

use super::{ChannelTimers, LogDelivery, Session, SessionEnd, Sub};
use crate::error::ApiError;
use crate::gateway::wire::Acks;
use crate::publish::{fingerprint, validate_idempotency_key, Publish, ScopedKey};
use crate::rooms;

/// The presence fields of a subscribe frame.
pub(crate) struct PresenceArgs {
    pub client_id: Option<String>,
    pub info: Option<Box<RawValue>>,
}

impl Session {
    /// Subscribe; the flag says the channel is a closed room with nothing
    /// left to deliver (the caller ends the subscription after the reply).
    pub(super) async fn subscribe(
        &mut self,
        req: Option<u64>,
        channel: &ChannelName,
        since: Option<herald_proto::Since>,
        presence: PresenceArgs,
    ) -> Result<(OkFrame, bool), ApiError> {
        let state = self.state.clone();
        let ns = state.config.namespaces.resolve(channel)?;
        if !self.identity.may_subscribe(channel) {
            return Err(ApiError::new(ErrorCode::Forbidden, "the token does not allow this channel"));
        }
        if self.regs.subs.contains_key(channel) {
            return Err(ApiError::new(ErrorCode::AlreadySubscribed, "already subscribed on this connection"));
        }
        // The backend's say, after the token's (proxies.rs).
        crate::integration::proxies::subscribe(
            &state,
            &self.identity.sub,
            self.identity.device.as_deref(),
            channel,
        )
        .await?;
        if self.regs.subs.len() >= state.config.websocket.max_subscriptions {
            return Err(ApiError::new(
                ErrorCode::TooManySubscriptions,
                format!("at most {} subscriptions per connection", state.config.websocket.max_subscriptions),
            ));
        }
        let room_closed = if ns.room {
            match state.engine.room(channel).await? {
                None => return Err(rooms::no_such_room()),
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
        self.regs.subs.insert(
            channel.clone(),
            Sub {
                log: durable.then(|| LogDelivery { delivery: Subscription::starting(), subscriber: None }),
                presence: None,
            },
        );
        let mut result = self.start_subscription(req, channel, since, ns).await;
        if let Ok(ok) = &mut result {
            if ns.presence && !room_closed {
                if let Err(e) = self.join_presence(channel, ok, presence).await {
                    result = Err(e);
                }
            }
        }
        match result {
            Ok(ok) => {
                let idle = self
                    .regs
                    .subs
                    .get(channel)
                    .and_then(|s| s.log.as_ref())
                    .is_some_and(|l| l.delivery.is_live());
                Ok((ok, room_closed && idle))
            }
            Err(e) => {
                self.regs.remove(channel);
                Err(e)
            }
        }
    }

    /// Make this connection a member of `channel` (see `rooms::join`).
    async fn join_presence(
        &mut self,
        channel: &ChannelName,
        ok: &mut OkFrame,
        args: PresenceArgs,
    ) -> Result<(), ApiError> {
        // The token's `info` claim wins over the frame's.
        let info = match self.identity.info.as_deref().or(args.info.as_ref().map(|r| r.get())) {
            Some(text) => {
                let bad = |e: String| ApiError::new(ErrorCode::BadRequest, format!("invalid `info`: {e}"));
                // The rule of `data` on depth: a member is stored and sent
                // inside other documents, which must stay readable.
                let raw: &RawValue = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
                herald_proto::check_data(raw, self.state.config.publish.max_data_depth)
                    .map_err(|e| ApiError::new(ErrorCode::BadData, format!("`info`: {e}")))?;
                Some(serde_json::from_str(text).map_err(|e| bad(e.to_string()))?)
            }
            None => None,
        };
        let member = Member {
            client_id: args.client_id.unwrap_or_else(new_client_id),
            user: self.identity.sub.to_string(),
            device: self.identity.device.as_deref().map(str::to_owned),
            info,
        };
        let hold = rooms::join(&self.state, channel, member).await?;
        ok.client_id = Some(hold.member.client_id.clone());
        if let Some(sub) = self.regs.subs.get_mut(channel) {
            sub.presence = Some(Box::new(hold));
        }
        Ok(())
    }

    /// Renew every member lease of this connection. A lease taken over by a
    /// newer join is dropped. One that is gone (it expired while this
    /// connection could not renew, and its leave was announced) lapses: it
    /// is asked back only once the peer answers a ping sent after this
    /// moment (the one this tick sends), so a connection that closed or
    /// went silent meanwhile (e.g. while this node was paused) never
    /// brings its member back.
    pub(super) async fn renew_presence(&mut self) {
        let state = self.state.clone();
        let ttl = state.config.presence.member_lease_ttl;
        let holds: Vec<(ChannelName, rooms::MemberLease)> = self
            .regs
            .subs
            .iter()
            .filter_map(|(c, s)| s.presence.as_ref().map(|h| (c.clone(), (**h).clone())))
            .collect();
        let mark = self.liveness.mark();
        for (channel, hold) in holds {
            if hold.lapsed.is_some() {
                continue; // waits for the peer's answer (`rejoin_lapsed`)
            }
            let outcome = match state.engine.presence_renew(&channel, &hold.key, hold.token, ttl).await {
                Ok(o) => o,
                Err(e) => {
                    tracing::warn!(channel = %channel, error = %e, "presence renew failed; retrying next tick");
                    continue;
                }
            };
            let Some(sub) = self.regs.subs.get_mut(&channel) else { continue };
            match outcome {
                Renewed::Until(_) => {}
                Renewed::Superseded => sub.presence = None,
                Renewed::Gone => {
                    if let Some(h) = sub.presence.as_mut() {
                        h.lapsed = Some(mark);
                    }
                }
            }
        }
    }

    /// Ask back the lapsed leases whose mark the peer's pongs have passed
    /// (see `renew_presence`). A fenced one is dropped; a failed one waits
    /// for a newer answer.
    pub(super) async fn rejoin_lapsed(&mut self) {
        let state = self.state.clone();
        let due: Vec<(ChannelName, rooms::MemberLease)> = self
            .regs
            .subs
            .iter()
            .filter_map(|(c, s)| s.presence.as_ref().map(|h| (c.clone(), (**h).clone())))
            .filter(|(_, h)| h.lapsed.is_some_and(|m| self.liveness.proven_since(m)))
            .collect();
        for (channel, hold) in due {
            let result = rooms::rejoin(&state, &channel, &hold).await;
            let mark = self.liveness.mark();
            let Some(sub) = self.regs.subs.get_mut(&channel) else { continue };
            match result {
                Ok(true) => {
                    if let Some(h) = sub.presence.as_mut() {
                        h.lapsed = None;
                    }
                }
                // A closed room takes no members back.
                Ok(false) | Err(EngineError::Closed) => sub.presence = None,
                Err(e) => {
                    tracing::warn!(channel = %channel, error = %e, "presence rejoin failed; retrying after the next ping");
                    if let Some(h) = sub.presence.as_mut() {
                        h.lapsed = Some(mark);
                    }
                }
            }
        }
    }

    /// Whether a lapsed lease waits for the peer's answer.
    pub(super) fn has_lapsed(&self) -> bool {
        self.regs.subs.values().any(|s| s.presence.as_ref().is_some_and(|h| h.lapsed.is_some()))
    }

    /// `{"type":"presence"}`: the channel's members and their count.
    pub(super) async fn presence_list(&mut self, channel: &ChannelName) -> Result<OkFrame, ApiError> {
        let state = self.state.clone();
        let ns = state.config.namespaces.resolve(channel)?;
        if !ns.presence {
            return Err(ApiError::new(ErrorCode::NotSupported, "this namespace has no presence"));
        }
        if !self.identity.may_subscribe(channel) {
            return Err(ApiError::new(ErrorCode::Forbidden, "the token does not allow this channel"));
        }
        let (count, members) =
            rooms::list(&state, ns, channel, false, state.config.presence.max_members_listed).await?;
        Ok(OkFrame { channel: Some(channel.to_string()), count: Some(count), members, ..Default::default() })
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
            self.catchup.push_back(channel.clone());
        }
        if let Some(log) = self.regs.subs.get_mut(channel).and_then(|s| s.log.as_mut()) {
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
        let opts = if self.wire.acks() == Acks::RecoverOffset {
            let claimed = since.filter(|_| !start.epoch_changed).map_or(0, |s| s.seq);
            if claimed > start.stored {
                state.engine.ack(channel, &subscriber, claimed).await.map_err(ack_error)?;
                state.metrics.acks.inc();
            }
            None
        } else {
            Some(AckOpts::from(ns))
        };
        self.begin_delivery(&mut ok, channel, &start, Some(subscriber), opts);
        ok.cursor = Some(start.stored);
        ok.unread = Some(start.unread());
        Ok(ok)
    }

    /// A cumulative ack: stored in the engine (batched there, no fsync per
    /// ack), then the window moves and paused delivery resumes.
    pub(super) async fn ack(&mut self, channel: &ChannelName, seq: Seq) -> Result<(), ApiError> {
        let Some(log) = self.regs.subs.get(channel).map(|s| s.log.as_ref()) else {
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
        if let Some(log) = self.regs.subs.get_mut(channel).and_then(|s| s.log.as_mut()) {
            let mut timers = ChannelTimers { queue: &mut self.timers, channel };
            if log.delivery.on_acked(seq, cursor.seq, &mut timers) && !self.catchup.contains(channel) {
                // The window opened: resume from the log.
                self.catchup.push_back(channel.clone());
            }
        }
        Ok(())
    }

    /// A redelivery timer fired.
    pub(super) async fn on_timer(&mut self, (channel, seq): (ChannelName, Seq)) -> Result<(), SessionEnd> {
        let Some(log) = self.regs.subs.get_mut(&channel).and_then(|s| s.log.as_mut()) else {
            return Ok(());
        };
        match log.delivery.on_timer(seq, &mut ChannelTimers { queue: &mut self.timers, channel: &channel }) {
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
        let ns = self.state.config.namespaces.resolve(channel)?;
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

/// A client id for a connection that did not name one: random, so it never
/// reclaims another connection's membership.
pub(crate) fn new_client_id() -> String {
    format!("c-{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}
