//! Presence on Redis: member leases with fencing tokens, and the sweep of
//! expired leases that any node may run.
//!
//! Per channel (one slot, see `keys.rs`): the lease hash, the expiry set,
//! the key set and the token counter, always changed together by one
//! script (`scripts/`), plus what a rejoin is checked against: each
//! member's last removal (`presence:gone`, its token and whether its holder
//! left or it was swept), written by the leave and sweep scripts and
//! forgotten after `GONE_MEMORY`. Times are Redis's (`TIME` inside the scripts), so
//! a lease expires on time whichever node wrote it and whatever the
//! nodes' clocks say.
//!
//! # The sweep index
//!
//! `presence_expire` is global, and Redis cannot range over the channels
//! of a cluster, so channels with leases are indexed in one sorted set,
//! `presence:due` (its own slot), scored by when the channel should be
//! swept next. Invariant: every lease of a channel expires at or after the
//! channel's score, or a sweep of the channel is under way. The index may
//! only be early (a stale entry costs one no-op sweep); the per-channel
//! sweep script re-checks every expiry, so the index never decides what
//! is removed, and each lease is removed (and returned) by exactly one
//! script run.
//!
//! - **join** lowers the channel's score to now + ttl *before* its script
//!   (so a node that dies right after the script leaves the channel
//!   indexed) and to the lease's exact expiry *after* it (so a sweep that
//!   ran between the two cannot leave the new lease unindexed);
//! - **renew** only moves expiries later: the score stays valid;
//! - **leave** and a closing room only remove leases: the score is early;
//! - **sweep**: claim due channels (score ≤ now) by setting their score to
//!   now + claim + 0.5 (no other sweeper takes them meanwhile), run each
//!   channel's sweep script, then settle: if the score is still our claim,
//!   set it to the earliest expiry left, or remove the channel when no
//!   lease is left. A join in between replaced the claim (a claim has a
//!   `.5`, a join's score has none), so the settle leaves the join's score
//!   alone and nothing is raised past a lease.
//!
//! A channel whose index entry is lost (Redis lost the index key, or a
//! node died between a join's script and both index writes, which only a
//! concurrent sweep of that channel at that moment makes possible) is
//! indexed again by its next join; the sweep then removes every expired
//! lease of the channel, so their `leave`s come late, never twice.
//!
//! The index lives on one node of a cluster, which scores with its own
//! clock: a channel on another master is swept late (or early, then
//! re-scored) by the difference between the two clocks.

use std::future::Future;
use std::time::Duration;

use herald_core::{
    member_key, EngineError, Joined, Lease, LeaseJoin, LeaseLeave, LeaseRejoin, LeaseRenew, Member, Rejoined,
    Renewed,
};
use herald_proto::ChannelName;

use crate::config::SWEEP_CHANNELS;
use crate::reply::{Fields, Reply};
use crate::scripts::{
    IndexClaim, IndexLower, IndexSettle, OrEmpty, PresenceCount, PresenceHasUser, PresenceJoin,
    PresenceLeave, PresenceList, PresenceRejoin, PresenceRenew, PresenceSweep,
};
use crate::state::{ms, EngineState};

/// A lease record: `<token> <expires_at_ms> <member JSON>`.
fn parse_lease(rec: &str) -> Result<Lease, EngineError> {
    let bad = || EngineError::Unavailable("redis presence: malformed lease".into());
    let mut parts = rec.splitn(3, ' ');
    let (Some(token), Some(exp), Some(member)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad());
    };
    let member: Member = serde_json::from_str(member).map_err(|_| bad())?;
    Ok(Lease {
        member,
        token: token.parse().map_err(|_| bad())?,
        expires_at_ms: exp.parse().map_err(|_| bad())?,
    })
}

fn parse_leases(recs: Fields) -> Result<Vec<Lease>, EngineError> {
    recs.map(|r| parse_lease(&r.string("lease")?)).collect()
}

impl EngineState {
    /// Settle a sweeper's claim on `channel` (see the module docs).
    async fn index_settle(&self, channel: &str, claim: &str, next: &str) -> Result<Reply, EngineError> {
        let args = IndexSettle { due: self.keys.presence_due(), channel, claim, next };
        self.run("presence settle", &args).await
    }

    /// Lower the channel's sweep-index score (see the module docs).
    async fn index_lower(
        &self,
        ch: &ChannelName,
        score: Option<u64>,
        ttl: Duration,
    ) -> Result<(), EngineError> {
        let args = IndexLower {
            due: self.keys.presence_due(),
            channel: ch.as_str(),
            score: OrEmpty(score),
            ttl_ms: ms(ttl),
        };
        self.run("presence index", &args).await.map(drop)
    }

    /// Run `script`, a write that may store a lease of `ch` until now +
    /// `ttl`, with the channel indexed before and after it (see the module
    /// docs): before, so a node dying after the script still leaves the
    /// channel where a sweep finds it; after, exactly at the lease's
    /// expiry, so a sweep that settled the channel between the first index
    /// write and the script cannot leave the lease unindexed. `script`
    /// answers its outcome and the expiry of the lease it stored (`None`:
    /// none). Three round trips.
    async fn indexed<T>(
        &self,
        ch: &ChannelName,
        ttl: Duration,
        what: &'static str,
        script: impl Future<Output = Result<(T, Option<u64>), EngineError>>,
    ) -> Result<T, EngineError> {
        self.index_lower(ch, None, ttl).await?;
        let (outcome, expires_at_ms) = script.await?;
        if let Some(exp) = expires_at_ms {
            if let Err(e) = self.index_lower(ch, Some(exp), ttl).await {
                tracing::warn!(channel = %ch, error = %e, "presence index not lowered after a {what}; the earlier write covers it");
            }
        }
        Ok(outcome)
    }

    /// Indexed before and after the join script ([`Self::indexed`]).
    pub async fn lease_join(&self, join: LeaseJoin) -> Result<Joined, EngineError> {
        self.refuse_when_closing()?;
        let LeaseJoin { channel: ch, member, ttl } = join;
        let ch = &ch;
        let script = async {
            let k = &self.keys;
            let json = serde_json::to_string(&member).expect("members serialise");
            let args = PresenceJoin {
                meta: k.meta(ch),
                presence: k.presence(ch),
                presence_exp: k.presence_exp(ch),
                presence_keys: k.presence_keys(ch),
                presence_token: k.presence_token(ch),
                member_key: &member_key(&member),
                member: &json,
                ttl_ms: ms(ttl),
            };
            let mut r = self.run("presence join", &args).await?.fields("reply")?;
            let kind = r.status()?;
            if kind == "closed" {
                return Err(self.refuse_closed());
            }
            let token = r.int("token")?;
            let expires_at_ms = r.int("expires_at")?;
            let lease = Lease { member, token, expires_at_ms };
            let joined = match kind.as_str() {
                "new" => Ok(Joined::New(lease)),
                "reclaimed" => Ok(Joined::Reclaimed(lease)),
                _ => Err(r.unexpected()),
            };
            Ok((joined, Some(expires_at_ms)))
        };
        self.indexed(ch, ttl, "join", script).await?
    }

    pub async fn lease_renew(&self, renew: LeaseRenew) -> Result<Renewed, EngineError> {
        let LeaseRenew { channel: ch, key, token, ttl } = renew;
        let ch = &ch;
        let args = PresenceRenew {
            presence: self.keys.presence(ch),
            presence_exp: self.keys.presence_exp(ch),
            member_key: &key,
            token,
            ttl_ms: ms(ttl),
        };
        let mut r = self.run("presence renew", &args).await?.fields("reply")?;
        match r.status()?.as_str() {
            "until" => Ok(Renewed::Until(r.int("until")?)),
            "superseded" => Ok(Renewed::Superseded),
            "gone" => Ok(Renewed::Gone),
            _ => Err(r.unexpected()),
        }
    }

    pub async fn lease_leave(&self, leave: LeaseLeave) -> Result<Option<Lease>, EngineError> {
        let LeaseLeave { channel: ch, key, token } = leave;
        let ch = &ch;
        let k = &self.keys;
        let args = PresenceLeave { leases: k.leases(ch), meta: k.meta(ch), member_key: &key, token };
        let mut r = self.run("presence leave", &args).await?.fields("reply")?;
        match r.status()?.as_str() {
            "none" => Ok(None),
            "left" => parse_lease(&r.string("lease")?).map(Some),
            _ => Err(r.unexpected()),
        }
    }

    /// Indexed like a join ([`Self::indexed`]): a lease that comes back
    /// must be swept like any other.
    pub async fn lease_rejoin(&self, rejoin: LeaseRejoin) -> Result<Rejoined, EngineError> {
        self.refuse_when_closing()?;
        let LeaseRejoin { channel: ch, member, token, ttl } = rejoin;
        let ch = &ch;
        let script = async {
            let k = &self.keys;
            let json = serde_json::to_string(&member).expect("members serialise");
            let args = PresenceRejoin {
                meta: k.meta(ch),
                leases: k.leases(ch),
                member_key: &member_key(&member),
                member: &json,
                token,
                ttl_ms: ms(ttl),
            };
            let mut r = self.run("presence rejoin", &args).await?.fields("reply")?;
            match r.status()?.as_str() {
                "closed" => Err(self.refuse_closed()),
                "fenced" => Ok((Rejoined::Fenced, None)),
                "held" => {
                    let until = r.int("expires_at")?;
                    Ok((Rejoined::Held(until), Some(until)))
                }
                "back" => {
                    let expires_at_ms = r.int("expires_at")?;
                    Ok((Rejoined::Back(Lease { member, token, expires_at_ms }), Some(expires_at_ms)))
                }
                _ => Err(r.unexpected()),
            }
        };
        self.indexed(ch, ttl, "rejoin", script).await
    }

    pub async fn presence(&self, ch: &ChannelName, limit: usize) -> Result<Vec<Lease>, EngineError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let args = PresenceList {
            presence: self.keys.presence(ch),
            presence_exp: self.keys.presence_exp(ch),
            presence_keys: self.keys.presence_keys(ch),
            limit,
        };
        parse_leases(self.run("presence", &args).await?.fields("leases")?)
    }

    pub async fn presence_count(&self, ch: &ChannelName) -> Result<u64, EngineError> {
        let args = PresenceCount { presence_exp: self.keys.presence_exp(ch) };
        self.run("presence count", &args).await?.int("count")
    }

    pub async fn presence_has_user(&self, ch: &ChannelName, user: &str) -> Result<bool, EngineError> {
        if user.is_empty() {
            return Ok(false);
        }
        // The start of every member key of `user` (see `member_key`).
        let prefix = format!("{}:{user}", user.len());
        let args = PresenceHasUser {
            presence_exp: self.keys.presence_exp(ch),
            presence_keys: self.keys.presence_keys(ch),
            user_prefix: &prefix,
        };
        Ok(self.run("presence has user", &args).await?.int("has user")? == 1)
    }

    /// Claim due channels, sweep each (concurrently, sharing `limit`),
    /// settle each claim. See the module docs.
    pub async fn presence_expire(&self, limit: usize) -> Result<Vec<(ChannelName, Lease)>, EngineError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let n = limit.min(SWEEP_CHANNELS);
        let args = IndexClaim { due: self.keys.presence_due(), n, claim_ms: self.sweep_claim_ms };
        let mut r = self.run("presence claim", &args).await?.fields("reply")?;
        let claim = r.string("claim")?;
        let names = r.fields("claimed")?;
        if claim.is_empty() || names.is_empty() {
            return Ok(Vec::new());
        }
        let mut channels = Vec::with_capacity(names.len());
        for name in names {
            let name = name.string("channel")?;
            match ChannelName::new(&name) {
                Ok(ch) => channels.push(ch),
                Err(_) => {
                    // Not ours (or corrupt): drop it from the index.
                    tracing::warn!(entry = %name, "presence index entry is not a channel name; removed");
                    let _ = self.index_settle(&name, &claim, "").await;
                }
            }
        }
        // Each channel takes at most its share, so the total stays within
        // `limit`; a channel with more expired leases is due again at once.
        let share = (limit / channels.len().max(1)).max(1);
        let sweeps = channels.iter().map(|ch| self.sweep_channel(ch, share, &claim));
        let results = futures_util::future::join_all(sweeps).await;
        let mut out = Vec::new();
        let mut first_err = None;
        for (ch, r) in channels.into_iter().zip(results) {
            match r {
                Ok(leases) => out.extend(leases.into_iter().map(|l| (ch.clone(), l))),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        self.counters.presence_expired.add(out.len() as u64);
        match first_err {
            // Leases removed by the channels that worked must reach the
            // caller (nobody else gets them): the failure waits for the
            // next call.
            Some(e) if out.is_empty() => Err(e),
            _ => Ok(out),
        }
    }

    /// Sweep one claimed channel and settle its claim.
    async fn sweep_channel(
        &self,
        ch: &ChannelName,
        limit: usize,
        claim: &str,
    ) -> Result<Vec<Lease>, EngineError> {
        let k = &self.keys;
        let args = PresenceSweep { leases: k.leases(ch), limit };
        let swept = self.run("presence sweep", &args).await;
        let (next, leases) = match swept {
            Ok(reply) => {
                let mut r = reply.fields("reply")?;
                let next = r.string("next")?;
                let recs = r.fields("swept")?;
                // Removed already: a record that does not parse is logged
                // and skipped, the others still reach the caller.
                let mut leases = Vec::new();
                for rec in recs {
                    match rec.string("lease").and_then(|s| parse_lease(&s)) {
                        Ok(l) => leases.push(l),
                        Err(e) => {
                            tracing::warn!(channel = %ch, error = %e, "swept a malformed lease; no leave announced")
                        }
                    }
                }
                (next, Ok(leases))
            }
            // Give the channel back at once (score 0: due), for the next call.
            Err(e) => ("0".to_owned(), Err(e)),
        };
        if let Err(e) = self.index_settle(ch.as_str(), claim, &next).await {
            // The claim runs out by itself; the channel is swept then.
            tracing::debug!(channel = %ch, error = %e, "presence claim not settled");
        }
        leases
    }
}
