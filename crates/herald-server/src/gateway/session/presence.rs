//! The presence keeper of a session: each subscription of a presence
//! channel holds a member lease (`rooms::MemberLease`, in its `Sub`),
//! joined at subscribe, renewed on every tick, asked back after a lapse
//! only once the peer proves alive (`session/liveness.rs`), and listed on
//! request. See the module docs of `session.rs` for when a lease is left
//! at once and when it is left to expire.

use herald_core::{EngineError, Member, Renewed};
use herald_proto::{ChannelName, ErrorCode, OkFrame};
use serde_json::value::RawValue;

use super::Session;
use crate::error::ApiError;
use crate::rooms;

/// The presence fields of a subscribe frame.
#[derive(Default)]
pub(crate) struct PresenceArgs {
    pub client_id: Option<String>,
    pub info: Option<Box<RawValue>>,
}

impl Session {
    /// Make this connection a member of `channel` (see `rooms::join`).
    pub(super) async fn join_presence(
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
                herald_proto::check_data(raw, self.state.config().publish.max_data_depth)
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
        if let Some(sub) = self.chans.regs.subs.get_mut(channel) {
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
        let ttl = state.config().presence.member_lease_ttl;
        let holds: Vec<(ChannelName, rooms::MemberLease)> = self
            .chans
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
            let Some(sub) = self.chans.regs.subs.get_mut(&channel) else { continue };
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
            .chans
            .regs
            .subs
            .iter()
            .filter_map(|(c, s)| s.presence.as_ref().map(|h| (c.clone(), (**h).clone())))
            .filter(|(_, h)| h.lapsed.is_some_and(|m| self.liveness.proven_since(m)))
            .collect();
        for (channel, hold) in due {
            let result = rooms::rejoin(&state, &channel, &hold).await;
            let mark = self.liveness.mark();
            let Some(sub) = self.chans.regs.subs.get_mut(&channel) else { continue };
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
        self.chans.regs.subs.values().any(|s| s.presence.as_ref().is_some_and(|h| h.lapsed.is_some()))
    }

    /// `{"type":"presence"}`: the channel's members and their count.
    pub(super) async fn presence_list(&mut self, channel: &ChannelName) -> Result<OkFrame, ApiError> {
        let state = self.state.clone();
        let ns = state.config().namespaces.resolve(channel)?;
        if !ns.presence {
            return Err(ApiError::new(ErrorCode::NotSupported, "this namespace has no presence"));
        }
        if !self.identity.may_subscribe(channel, ns) {
            return Err(ApiError::new(ErrorCode::Forbidden, "the token does not allow this channel"));
        }
        let (count, members) =
            rooms::list(&state, ns, channel, false, state.config().presence.max_members_listed).await?;
        Ok(OkFrame { channel: Some(channel.to_string()), count: Some(count), members, ..Default::default() })
    }
}

/// A client id for a connection that did not name one: random, so it never
/// reclaims another connection's membership.
pub(crate) fn new_client_id() -> String {
    format!("c-{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}
