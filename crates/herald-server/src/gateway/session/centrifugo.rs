//! Centrifugo's commands applied on a session (docs/centrifugo.md; the
//! wire that decodes them and encodes the replies is
//! `gateway::wire::centrifugo`).
//!
//! Hub registration, the delivery state machine, catch-up, presence, the
//! publish pipeline, the frame budget and every close are the session's;
//! this module answers Centrifugo's commands by calling the same handlers
//! as Herald's frames. Differences kept here:
//! - the connection starts anonymous; only `connect` is accepted until it
//!   sets the identity (a token verified like `/ws`'s);
//! - a subscribe with `recover` answers the missed messages in its reply
//!   (`recovered: true`), read through the catch-up path and its state
//!   machine, so live messages follow without gap or duplicate; above
//!   `history.max_limit` missed messages, or after truncation, a new
//!   epoch or an offset from the future, it answers `recovered: false` and
//!   starts live;
//! - acked channels: no acks and no redelivery on this protocol; the recover
//!   offset of a subscribe acknowledges up to it, and the first subscribe's
//!   recovery carries the offline inbox;
//! - the wire's pings (`{}`) are answered by the client's own, a pong
//!   command.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::SinkExt;
use herald_core::{Delivery, Epoch, Message, Position};
use herald_proto::centrifugo::{
    self as cf, Answer, ClientInfo, ConnectRequest, ConnectResult, Empty, HistoryResult, Method,
    PresenceResult, PresenceStatsResult, Publication, RefreshResult, Reply, StreamPosition, SubscribeRequest,
    SubscribeResult,
};
use herald_proto::{close, ChannelName, ErrorCode, OkFrame, Since, StoredFrame};

use super::deliver::{PageStep, CATCHUP_PAGE};
use super::presence::PresenceArgs;
use super::requests::Asker;
use super::{pipeline, Session, SessionEnd};
use crate::auth::Identity;
use crate::error::ApiError;
use crate::gateway::wire::centrifugo::Conn;

fn bad_request(reason: &'static str) -> SessionEnd {
    SessionEnd::Close { code: close::BAD_REQUEST, reason, reconnect: false }
}

/// When the SDK should refresh a token expiring at `exp`: after three
/// quarters of the time left, in whole seconds rounded down (at least 1 s,
/// the protocol's unit), so the new token arrives before `exp`; the
/// connection closes only `jwt.refresh_grace` (plus `jwt.leeway_secs`)
/// after it.
fn ttl(exp: u64) -> u32 {
    let left = (UNIX_EPOCH + Duration::from_secs(exp)).duration_since(SystemTime::now()).unwrap_or_default();
    u32::try_from(left.as_millis() * 3 / 4000).unwrap_or(u32::MAX).max(1)
}

impl Session {
    fn conn(&mut self) -> &mut Conn {
        self.wire.centrifugo().expect("Centrifugo commands on a Centrifugo wire")
    }

    /// A Centrifugo command (see `Session::apply`).
    pub(super) async fn apply_centrifugo(&mut self, id: u32, method: Method) -> Result<(), SessionEnd> {
        // Each command costs one frame of the budget, as a frame of /ws.
        if !self.take_budget()? {
            // A command without id (a pong) has no reply to get.
            if id != 0 {
                let err = ApiError::new(ErrorCode::RateLimited, "too many commands; slow down");
                self.send_error(&err, Some(id.into()), None).await?;
            }
            return Ok(());
        }
        if !matches!(method, Method::Publish(_) | Method::Pong) {
            // After every earlier publish is answered (`session/pipeline.rs`).
            Box::pin(self.settle_publishes()).await?;
        }
        Box::pin(self.on_command(id, method)).await
    }

    /// A Centrifugo command that decoded but cannot be applied (see
    /// `wire::Command::Invalid`): charged and ordered as any command.
    pub(super) async fn apply_invalid(&mut self, id: u32, error: ApiError) -> Result<(), SessionEnd> {
        if !self.take_budget()? {
            if id != 0 {
                let err = ApiError::new(ErrorCode::RateLimited, "too many commands; slow down");
                self.send_error(&err, Some(id.into()), None).await?;
            }
            return Ok(());
        }
        if !self.conn().connected {
            return Err(bad_request("connect first"));
        }
        // Answered in command order, after the publishes before it.
        Box::pin(self.settle_publishes()).await?;
        self.send_error(&error, Some(id.into()), None).await
    }

    async fn on_command(&mut self, id: u32, method: Method) -> Result<(), SessionEnd> {
        let req = Some(u64::from(id));
        if !self.conn().connected && !matches!(method, Method::Connect(_) | Method::Pong) {
            return Err(bad_request("connect first"));
        }
        let reply: Result<Vec<u8>, ApiError> = match method {
            Method::Pong => {
                let ping = self.conn().ping.take();
                if ping.is_some_and(|p| self.liveness.on_pong(&p)) && self.has_lapsed() {
                    Box::pin(self.rejoin_lapsed()).await;
                }
                return Ok(());
            }
            Method::Connect(c) => return Box::pin(self.connect(id, c)).await,
            Method::Refresh(r) => return self.refresh(id, &r.token).await,
            Method::Subscribe(s) => return Box::pin(self.subscribe_command(id, s)).await,
            Method::Unsubscribe(u) => match channel(&u.channel) {
                Ok(c) => {
                    // Unsubscribing what is not subscribed is fine here.
                    self.unsubscribe(&c).await;
                    Ok(self.wire.reply(&Reply::new(id, Answer::Unsubscribe(Empty {}))))
                }
                Err(e) => Err(e),
            },
            Method::Publish(p) => {
                let (channel, publish) = match channel(&p.channel) {
                    Ok(c) => {
                        let publish = self.prepare_publish(&c, p.data, None, None);
                        (c, publish)
                    }
                    Err(e) => {
                        // Answered in command order, after the publishes before it.
                        Box::pin(self.settle_publishes()).await?;
                        return self.send_error(&e, req, None).await;
                    }
                };
                self.queue_publish(pipeline::Queued { req, channel, publish });
                return Ok(());
            }
            Method::Presence(p) => self.presence_members(&p.channel).await.map(|(_, members)| {
                let presence =
                    members.into_iter().map(|m| (m.client_id.clone(), ClientInfo::from(m))).collect();
                self.wire.reply(&Reply::new(id, Answer::Presence(PresenceResult { presence })))
            }),
            Method::PresenceStats(p) => self.presence_members(&p.channel).await.map(|(count, members)| {
                let users: std::collections::BTreeSet<&str> =
                    members.iter().map(|m| m.user.as_str()).collect();
                let stats = PresenceStatsResult { num_clients: count, num_users: users.len() as u64 };
                self.wire.reply(&Reply::new(id, Answer::PresenceStats(stats)))
            }),
            Method::History(h) => Box::pin(self.history(id, h)).await,
            Method::Ping => Ok(self.wire.reply(&Reply::new(id, Answer::Ping(Empty {})))),
            Method::NotAvailable => Ok(self.wire.reply(&Reply::not_available(id))),
        };
        match reply {
            Ok(bytes) => self.send_bytes(bytes).await,
            Err(e) => self.send_error(&e, req, None).await,
        }
    }

    /// The identity of a `connect` or `refresh` token (dev mode: the
    /// upgrade's `?user=` when there is no token).
    async fn identity_of(&mut self, token: &str) -> Result<Identity, ApiError> {
        let device = self.conn().device.clone();
        if !token.is_empty() {
            crate::gateway::ws::verify_token(&self.state, token, device.as_deref()).await
        } else if self.state.config().dev {
            let user = self.conn().dev_user.clone().unwrap_or_else(|| self.conn().client.clone());
            crate::gateway::ws::dev_identity(&user, device.as_deref())
        } else {
            Err(ApiError::new(ErrorCode::Unauthorized, "missing token"))
        }
    }

    /// The close for a refused token: an expired one makes the SDK
    /// reconnect (and fetch a new token), any other stops it.
    fn token_refused(e: &ApiError) -> SessionEnd {
        match e.code {
            ErrorCode::TokenExpired => {
                SessionEnd::Close { code: close::TOKEN_EXPIRED, reason: "token expired", reconnect: true }
            }
            ErrorCode::Banned => {
                SessionEnd::Close { code: close::DISCONNECTED_FOR_GOOD, reason: "banned", reconnect: false }
            }
            ErrorCode::Unavailable | ErrorCode::Internal => {
                SessionEnd::Close { code: close::INTERNAL, reason: "engine unavailable", reconnect: true }
            }
            _ => SessionEnd::Close { code: close::UNAUTHORIZED, reason: "invalid token", reconnect: false },
        }
    }

    async fn connect(&mut self, id: u32, c: ConnectRequest) -> Result<(), SessionEnd> {
        let token = c.token.as_str();
        if self.conn().connected {
            return Err(bad_request("already connected"));
        }
        let headers = self.conn().headers.take();
        let state = self.state.clone();
        let identity = match (&state.config().proxies.connect, headers) {
            // No token and a connect proxy: the backend decides, as on /ws.
            (Some(p), Some(headers)) if token.is_empty() && self.conn().dev_user.is_none() => {
                let device = self.conn().device.clone();
                Box::pin(crate::integration::proxies::connect(&state, p, &headers, device.as_deref())).await
            }
            _ => self.identity_of(token).await,
        };
        // The engine's say (a ban, a revocation) after the token's.
        let identity = match identity {
            Ok(identity) => Box::pin(super::admit(&state, &identity)).await.map(|()| identity),
            Err(e) => Err(e),
        };
        self.identity = match identity {
            Ok(identity) => identity,
            // Error 109: the SDK fetches a new token and connects again.
            Err(e) if e.code == ErrorCode::TokenExpired => {
                return self.send_error(&e, Some(id.into()), None).await
            }
            Err(e) => return Err(Self::token_refused(&e)),
        };
        self.register();
        self.conn().connected = true;
        let subs = self.server_side_subscribe(c.subs).await?;
        let frames: Vec<Vec<StoredFrame>> = subs.iter().map(|(_, r)| r.frames()).collect();
        let result = ConnectResult {
            session: self.new_identity(),
            ping: u32::try_from(self.state.config().heartbeat.ping_interval.as_secs())
                .unwrap_or(u32::MAX)
                .max(1),
            pong: true,
            subs: subs.iter().zip(&frames).map(|((c, r), f)| (c.to_string(), r.result(f))).collect(),
        };
        let recovered: usize = frames.iter().map(Vec::len).sum();
        self.state.metrics.delivered.inc_by(recovered as u64);
        self.send_bytes(self.wire.reply(&Reply::new(id, Answer::Connect(result)))).await?;
        for (channel, r) in &subs {
            self.after_recovery(channel, r).await?;
        }
        Ok(())
    }

    /// The identity was just set (connect, refresh): reset its expiry
    /// timer, and say when to refresh.
    fn new_identity(&mut self) -> RefreshResult {
        let (expires, ttl) = (self.identity.exp.is_some(), self.identity.exp.map_or(0, ttl));
        let conn = self.conn();
        conn.identity_changed = true;
        RefreshResult {
            client: conn.client.clone(),
            version: concat!("herald ", env!("CARGO_PKG_VERSION")).into(),
            expires,
            ttl,
        }
    }

    /// A new token on a live connection: same user, new permissions and
    /// expiry. Subscriptions the new token no longer allows stay until the
    /// client ends them (as on `/ws`, permissions are checked at subscribe).
    async fn refresh(&mut self, id: u32, token: &str) -> Result<(), SessionEnd> {
        let identity = self.identity_of(token).await.map_err(|e| Self::token_refused(&e))?;
        if identity.sub != self.identity.sub {
            return Err(SessionEnd::Close {
                code: close::UNAUTHORIZED,
                reason: "token of another user",
                reconnect: false,
            });
        }
        let state = self.state.clone();
        Box::pin(super::admit(&state, &identity)).await.map_err(|e| Self::token_refused(&e))?;
        self.identity = identity;
        self.register();
        let result = self.new_identity();
        self.send_bytes(self.wire.reply(&Reply::new(id, Answer::Refresh(result)))).await
    }

    /// `subscribe`, with recovery in the reply (see the module docs).
    async fn subscribe_command(&mut self, id: u32, s: SubscribeRequest) -> Result<(), SessionEnd> {
        let req = Some(u64::from(id));
        let channel = match channel(&s.channel) {
            Ok(c) => c,
            Err(e) => return self.send_error(&e, req, None).await,
        };
        let r = match self.subscribe_recovering(req, &channel, &s, Asker::Client).await? {
            Ok(r) => r,
            Err(e) => return self.send_error(&e, req, None).await,
        };
        let frames = r.frames();
        let result = r.result(&frames);
        self.state.metrics.delivered.inc_by(result.publications.len() as u64);
        self.send_bytes(self.wire.reply(&Reply::new(id, Answer::Subscribe(result)))).await?;
        self.after_recovery(&channel, &r).await
    }

    /// A subscribe with Centrifugo's recovery from `s`'s position: the
    /// reply's fields and the missed messages it carries. `Err(ApiError)`:
    /// refused (answered by the caller); `Err(SessionEnd)`: the connection
    /// ends.
    async fn subscribe_recovering(
        &mut self,
        req: Option<u64>,
        channel: &ChannelName,
        s: &SubscribeRequest,
        by: Asker,
    ) -> Result<Result<Recovered, ApiError>, SessionEnd> {
        let ns = match self.state.config().namespaces.resolve(channel) {
            Ok(ns) => ns.clone(),
            Err(e) => return Ok(Err(e.into())),
        };
        let durable = ns.is_durable();
        let bound = self.state.config().history.max_limit;
        let recovering = durable && s.recover;
        let mut since = None;
        if recovering {
            let pos = match self.state.engine.position(channel).await {
                Ok(p) => p,
                Err(e) => return Ok(Err(e.into())),
            };
            // Another epoch, an offset from the future, a truncated log or
            // more missed messages than the bound (acked: the inbox is
            // delivered whole) start live, unrecovered.
            let same_epoch = s.epoch.is_empty() || s.epoch == pos.epoch.as_str();
            let retained = s.offset.saturating_add(1) >= pos.first;
            let within = ns.delivery == Delivery::Acked || pos.head.saturating_sub(s.offset) <= bound as u64;
            if same_epoch && s.offset <= pos.head && retained && within {
                since = Some(Since { seq: s.offset, epoch: Some(s.epoch.clone()).filter(|e| !e.is_empty()) });
            }
        }
        let client = self.conn().client.clone();
        let presence = PresenceArgs { client_id: Some(client), info: None };
        let (ok, ended) = match self.subscribe(req, channel, since.clone(), presence, by).await {
            Ok(x) => x,
            Err(e) => return Ok(Err(e)),
        };
        let lost = ok.truncated == Some(true) || ok.epoch_changed == Some(true);
        if since.is_some() && lost && ns.delivery != Delivery::Acked {
            // Trimmed or reset between the check above and the subscribe:
            // no publications either, start at the head it was resolved at.
            self.restart_at_head(channel, &ok);
        }
        let mut r = Recovered { result: SubscribeResult::default(), missed: Vec::new(), ended };
        if durable {
            r.missed = self.recover(channel, bound).await?;
            r.result.recoverable = true;
            r.result.positioned = true;
            r.result.epoch = ok.epoch.clone().unwrap_or_default();
            r.result.offset = self
                .chans
                .regs
                .subs
                .get(channel)
                .and_then(|s| s.log.as_ref())
                .map_or(0, |l| l.delivery.next().saturating_sub(1));
            r.result.was_recovering = recovering;
            r.result.recovered = since.is_some() && !lost;
        }
        Ok(Ok(r))
    }

    /// After a recovery's reply went out: a closed room whose final event
    /// was delivered ends its subscription.
    async fn after_recovery(&mut self, channel: &ChannelName, r: &Recovered) -> Result<(), SessionEnd> {
        if r.ended || r.missed.iter().any(|m| m.closes) {
            self.end_subscription(channel, "room_closed").await?;
            self.ws.flush().await.map_err(|_| SessionEnd::Gone)?;
        }
        Ok(())
    }

    /// The server-side subscriptions of a connect: the token's (or the
    /// connect proxy's) channel names, then the personal channel, each
    /// recovered from the position the SDK sent in `subs`. One that is
    /// refused (an unknown namespace, a room not created) is logged and
    /// left out of the reply; the connection stays.
    async fn server_side_subscribe(
        &mut self,
        mut positions: BTreeMap<String, SubscribeRequest>,
    ) -> Result<Vec<(ChannelName, Recovered)>, SessionEnd> {
        let mut channels = self.identity.server_side.clone();
        if let Some(personal) = self.personal_channel() {
            if !channels.contains(&personal) {
                channels.push(personal);
            }
        }
        let mut out = Vec::with_capacity(channels.len());
        for channel in channels {
            let s = positions.remove(channel.as_str()).unwrap_or_default();
            match self.subscribe_recovering(None, &channel, &s, Asker::Server).await? {
                Ok(r) => out.push((channel, r)),
                Err(e) => tracing::warn!(
                    channel = %channel,
                    code = e.code.as_str(),
                    detail = %e.detail,
                    "server-side subscription refused"
                ),
            }
        }
        Ok(out)
    }

    /// Make a just subscribed durable channel start after the head its
    /// subscribe resolved (as a subscribe without position would have).
    fn restart_at_head(&mut self, channel: &ChannelName, ok: &OkFrame) {
        let pos = Position {
            epoch: Epoch::new(ok.epoch.clone().unwrap_or_default()),
            first: ok.first.unwrap_or(1),
            head: ok.head.unwrap_or(0),
            closed: false,
        };
        if let Ok(start) = herald_core::delivery::resolve(&pos, None, None) {
            self.chans.catchup.retain(|c| c != channel);
            self.begin_delivery(&mut OkFrame::default(), channel, &start, None, None);
        }
    }

    /// The catch-up of a just subscribed channel, read now for the
    /// subscribe reply: at most `bound` messages and about
    /// `websocket.outbox_bytes`; what is left stays queued and goes out as
    /// pushes after the reply (in order, through `catchup_step`).
    async fn recover(
        &mut self,
        channel: &ChannelName,
        bound: usize,
    ) -> Result<Vec<Arc<Message>>, SessionEnd> {
        let max_bytes = self.state.config().websocket.outbox_bytes;
        let mut out: Vec<Arc<Message>> = Vec::new();
        let mut bytes = 0;
        while out.len() < bound && bytes < max_bytes && self.chans.catchup.contains(channel) {
            self.chans.catchup.retain(|c| c != channel);
            let limit = (bound - out.len()).min(CATCHUP_PAGE);
            if let PageStep::Send { messages, more } = self.read_page(channel, limit, false).await? {
                bytes += messages.iter().map(|m| m.frame.len()).sum::<usize>();
                out.extend(messages);
                if more {
                    self.chans.catchup.push_back(channel.clone());
                }
            }
        }
        Ok(out)
    }

    /// `history`: `since` (exclusive), `limit` (0: the position only;
    /// negative: up to `history.max_limit`), `reverse`.
    async fn history(&mut self, id: u32, h: cf::HistoryRequest) -> Result<Vec<u8>, ApiError> {
        let channel = channel(&h.channel)?;
        let ns = self.state.config().namespaces.resolve(&channel)?;
        if !self.identity.may_subscribe(&channel, ns) {
            return Err(ApiError::new(ErrorCode::Forbidden, "the token does not allow this channel"));
        }
        if !ns.is_durable() {
            return Err(ApiError::new(ErrorCode::NotSupported, "volatile channels keep no history"));
        }
        let state = self.state.clone();
        let pos = state.engine.position(&channel).await?;
        let max = state.config().history.max_limit;
        let limit = usize::try_from(h.limit).map_or(max, |l| l.min(max));
        let unrecoverable =
            |msg: &str| self.wire.reply(&Reply::error_code(id, cf::error_code::UNRECOVERABLE_POSITION, msg));
        let mut after = pos.first - 1;
        if let Some(StreamPosition { offset, epoch }) = &h.since {
            if !epoch.is_empty() && epoch != pos.epoch.as_str() {
                return Ok(unrecoverable("another epoch"));
            }
            if *offset > pos.head || offset.saturating_add(1) < pos.first {
                return Ok(unrecoverable("offset not in the retained log"));
            }
            after = *offset;
        }
        if h.reverse {
            after = after.max(pos.head.saturating_sub(limit as u64));
        }
        let page = if limit == 0 { None } else { Some(state.engine.read(&channel, after, limit).await?) };
        let messages = page.as_ref().map_or(&[][..], |p| &p.messages[..]);
        let mut frames = Vec::with_capacity(messages.len());
        for m in messages {
            frames.push(StoredFrame::parse(&m.frame).map_err(|e| {
                tracing::error!(channel = %channel, seq = ?m.seq, error = %e, "stored frame unreadable");
                ApiError::new(ErrorCode::Internal, "a stored message is unreadable")
            })?);
        }
        let mut publications: Vec<Publication> =
            frames.iter().map(|f| Publication::from_stored(f, cf::null_value())).collect();
        if h.reverse {
            publications.reverse();
        }
        let result = HistoryResult { publications, epoch: pos.epoch.to_string(), offset: pos.head };
        Ok(self.wire.reply(&Reply::new(id, Answer::History(result))))
    }

    /// A presence channel's member count and (up to
    /// `presence.max_members_listed`) members.
    async fn presence_members(&mut self, name: &str) -> Result<(u64, Vec<herald_proto::Member>), ApiError> {
        let ok = Box::pin(self.presence_list(&channel(name)?)).await?;
        Ok((ok.count.unwrap_or(0), ok.members.unwrap_or_default()))
    }
}

/// A subscribe's recovery, before its reply is encoded.
struct Recovered {
    /// The reply's fields but `publications`.
    result: SubscribeResult<'static>,
    /// The missed messages the reply carries, in order.
    missed: Vec<Arc<Message>>,
    /// A closed room with nothing left to deliver.
    ended: bool,
}

impl Recovered {
    fn frames(&self) -> Vec<StoredFrame<'_>> {
        self.missed.iter().filter_map(|m| StoredFrame::parse(&m.frame).ok()).collect()
    }

    /// The reply, its publications borrowed from `frames` ([`Self::frames`]).
    fn result<'f>(&self, frames: &'f [StoredFrame<'_>]) -> SubscribeResult<'f> {
        let r = &self.result;
        SubscribeResult {
            recoverable: r.recoverable,
            positioned: r.positioned,
            epoch: r.epoch.clone(),
            offset: r.offset,
            publications: frames.iter().map(|f| Publication::from_stored(f, cf::null_value())).collect(),
            recovered: r.recovered,
            was_recovering: r.was_recovering,
        }
    }
}

fn channel(name: &str) -> Result<ChannelName, ApiError> {
    ChannelName::new(name).map_err(|e| ApiError::new(ErrorCode::BadChannel, e.to_string()))
}
