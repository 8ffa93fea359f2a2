//! Presence on Redis: member leases with fencing tokens, and the sweep of
//! expired leases that any node may run.
//!
//! Per channel (one slot, see `keys.rs`): the lease hash, the expiry set,
//! the key set and the token counter, always changed together by one
//! script (`scripts.rs`), plus what a rejoin is checked against: each
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

use std::time::Duration;

use herald_core::{member_key, EngineError, FenceToken, Joined, Lease, Member, Rejoined, Renewed};
use herald_proto::ChannelName;
use redis::Value;

use crate::config::SWEEP_CHANNELS;
use crate::decode::{self, array, string, u64_of};
use crate::ops::{ms, Shared};
use crate::scripts;
use crate::stats::{add, bump};

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

fn parse_leases(v: Value) -> Result<Vec<Lease>, EngineError> {
    let recs = array(v, "leases").map_err(malformed)?;
    recs.into_iter().map(|r| parse_lease(&string(r, "lease").map_err(malformed)?)).collect()
}

fn malformed(e: redis::RedisError) -> EngineError {
    EngineError::Unavailable(format!("redis presence: {e}"))
}

/// The first element of a script reply (its kind) and the rest.
fn kind_of(v: Value) -> Result<(String, std::vec::IntoIter<Value>), EngineError> {
    let mut r = array(v, "reply").map_err(malformed)?.into_iter();
    let kind = string(r.next().ok_or_else(|| malformed(decode::bad("reply kind")))?, "reply kind");
    Ok((kind.map_err(malformed)?, r))
}

fn next_u64(r: &mut std::vec::IntoIter<Value>, what: &str) -> Result<u64, EngineError> {
    u64_of(r.next().ok_or_else(|| malformed(decode::bad(what)))?, what).map_err(malformed)
}

impl Shared {
    /// Run a script on `keys` with `args`, through the fail-fast path.
    async fn run(
        &self,
        what: &'static str,
        script: &redis::Script,
        keys: &[String],
        args: &[String],
    ) -> Result<Value, EngineError> {
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        for a in args {
            inv.arg(a);
        }
        let r = self.redis.call(what, |mut c| async move { inv.invoke_async::<Value>(&mut c).await }).await;
        self.failed(r)
    }

    /// Lower the channel's sweep-index score (see the module docs).
    async fn index_lower(
        &self,
        ch: &ChannelName,
        score: Option<u64>,
        ttl: Duration,
    ) -> Result<(), EngineError> {
        let args = [ch.to_string(), score.map(|s| s.to_string()).unwrap_or_default(), ms(ttl).to_string()];
        self.run("presence index", &scripts::INDEX_LOWER, &[self.keys.presence_due()], &args).await.map(drop)
    }

    pub async fn presence_join(
        &self,
        ch: &ChannelName,
        member: &Member,
        ttl: Duration,
    ) -> Result<Joined, EngineError> {
        // Indexed before the lease exists: a node dying after the script
        // still leaves the channel where a sweep finds it.
        self.index_lower(ch, None, ttl).await?;
        let k = &self.keys;
        let keys =
            [k.meta(ch), k.presence(ch), k.presence_exp(ch), k.presence_keys(ch), k.presence_token(ch)];
        let json = serde_json::to_string(member).expect("members serialise");
        let args = [member_key(member), json, ms(ttl).to_string()];
        let reply = self.run("presence join", &scripts::PRESENCE_JOIN, &keys, &args).await?;
        let (kind, mut r) = kind_of(reply)?;
        if kind == "closed" {
            bump(&self.counters.closed_refused);
            return Err(EngineError::Closed);
        }
        let token = next_u64(&mut r, "token")?;
        let expires_at_ms = next_u64(&mut r, "expires_at")?;
        // Exact, and after the script: a sweep that settled the channel
        // between the first index write and the script cannot have left
        // this lease unindexed.
        if let Err(e) = self.index_lower(ch, Some(expires_at_ms), ttl).await {
            tracing::warn!(channel = %ch, error = %e, "presence index not lowered after a join; the earlier write covers it");
        }
        let lease = Lease { member: member.clone(), token, expires_at_ms };
        match kind.as_str() {
            "new" => Ok(Joined::New(lease)),
            "reclaimed" => Ok(Joined::Reclaimed(lease)),
            _ => Err(malformed(decode::bad("join kind"))),
        }
    }

    pub async fn presence_renew(
        &self,
        ch: &ChannelName,
        key: &str,
        token: FenceToken,
        ttl: Duration,
    ) -> Result<Renewed, EngineError> {
        let keys = [self.keys.presence(ch), self.keys.presence_exp(ch)];
        let args = [key.to_owned(), token.to_string(), ms(ttl).to_string()];
        let reply = self.run("presence renew", &scripts::PRESENCE_RENEW, &keys, &args).await?;
        let (kind, mut r) = kind_of(reply)?;
        match kind.as_str() {
            "until" => Ok(Renewed::Until(next_u64(&mut r, "until")?)),
            "superseded" => Ok(Renewed::Superseded),
            "gone" => Ok(Renewed::Gone),
            _ => Err(malformed(decode::bad("renew kind"))),
        }
    }

    pub async fn presence_leave(
        &self,
        ch: &ChannelName,
        key: &str,
        token: FenceToken,
    ) -> Result<Option<Lease>, EngineError> {
        let k = &self.keys;
        let keys = [
            k.presence(ch),
            k.presence_exp(ch),
            k.presence_keys(ch),
            k.presence_gone(ch),
            k.presence_gone_exp(ch),
            k.meta(ch),
        ];
        let args = [key.to_owned(), token.to_string()];
        let reply = self.run("presence leave", &scripts::PRESENCE_LEAVE, &keys, &args).await?;
        let (kind, mut r) = kind_of(reply)?;
        match kind.as_str() {
            "none" => Ok(None),
            "left" => {
                let rec = string(r.next().ok_or_else(|| malformed(decode::bad("lease")))?, "lease");
                parse_lease(&rec.map_err(malformed)?).map(Some)
            }
            _ => Err(malformed(decode::bad("leave kind"))),
        }
    }

    /// Indexed like a join (before and after the script): a lease that
    /// comes back must be swept like any other.
    pub async fn presence_rejoin(
        &self,
        ch: &ChannelName,
        member: &Member,
        token: FenceToken,
        ttl: Duration,
    ) -> Result<Rejoined, EngineError> {
        self.index_lower(ch, None, ttl).await?;
        let k = &self.keys;
        let keys = [
            k.meta(ch),
            k.presence(ch),
            k.presence_exp(ch),
            k.presence_keys(ch),
            k.presence_gone(ch),
            k.presence_gone_exp(ch),
        ];
        let json = serde_json::to_string(member).expect("members serialise");
        let args = [member_key(member), json, token.to_string(), ms(ttl).to_string()];
        let reply = self.run("presence rejoin", &scripts::PRESENCE_REJOIN, &keys, &args).await?;
        let (kind, mut r) = kind_of(reply)?;
        let (rejoined, exp) = match kind.as_str() {
            "closed" => {
                bump(&self.counters.closed_refused);
                return Err(EngineError::Closed);
            }
            "fenced" => return Ok(Rejoined::Fenced),
            "held" => {
                let until = next_u64(&mut r, "expires_at")?;
                (Rejoined::Held(until), until)
            }
            "back" => {
                let expires_at_ms = next_u64(&mut r, "expires_at")?;
                (Rejoined::Back(Lease { member: member.clone(), token, expires_at_ms }), expires_at_ms)
            }
            _ => return Err(malformed(decode::bad("rejoin kind"))),
        };
        if let Err(e) = self.index_lower(ch, Some(exp), ttl).await {
            tracing::warn!(channel = %ch, error = %e, "presence index not lowered after a rejoin; the earlier write covers it");
        }
        Ok(rejoined)
    }

    pub async fn presence(&self, ch: &ChannelName, limit: usize) -> Result<Vec<Lease>, EngineError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let keys = [self.keys.presence(ch), self.keys.presence_exp(ch), self.keys.presence_keys(ch)];
        let reply = self.run("presence", &scripts::PRESENCE_LIST, &keys, &[limit.to_string()]).await?;
        parse_leases(reply)
    }

    pub async fn presence_count(&self, ch: &ChannelName) -> Result<u64, EngineError> {
        let reply =
            self.run("presence count", &scripts::PRESENCE_COUNT, &[self.keys.presence_exp(ch)], &[]).await?;
        u64_of(reply, "count").map_err(malformed)
    }

    pub async fn presence_has_user(&self, ch: &ChannelName, user: &str) -> Result<bool, EngineError> {
        if user.is_empty() {
            return Ok(false);
        }
        // The start of every member key of `user` (see `member_key`).
        let prefix = format!("{}:{user}", user.len());
        let keys = [self.keys.presence_exp(ch), self.keys.presence_keys(ch)];
        let reply = self.run("presence has user", &scripts::PRESENCE_HAS_USER, &keys, &[prefix]).await?;
        Ok(u64_of(reply, "has user").map_err(malformed)? == 1)
    }

    /// Claim due channels, sweep each (concurrently, sharing `limit`),
    /// settle each claim. See the module docs.
    pub async fn presence_expire(&self, limit: usize) -> Result<Vec<(ChannelName, Lease)>, EngineError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let due_key = self.keys.presence_due();
        let n = limit.min(SWEEP_CHANNELS);
        let args = [n.to_string(), self.sweep_claim_ms.to_string()];
        let reply =
            self.run("presence claim", &scripts::INDEX_CLAIM, std::slice::from_ref(&due_key), &args).await?;
        let mut r = array(reply, "claim").map_err(malformed)?.into_iter();
        let claim =
            string(r.next().ok_or_else(|| malformed(decode::bad("claim")))?, "claim").map_err(malformed)?;
        let names = array(r.next().ok_or_else(|| malformed(decode::bad("claimed")))?, "claimed")
            .map_err(malformed)?;
        if claim.is_empty() || names.is_empty() {
            return Ok(Vec::new());
        }
        let mut channels = Vec::with_capacity(names.len());
        for name in names {
            let name = string(name, "channel").map_err(malformed)?;
            match ChannelName::new(&name) {
                Ok(ch) => channels.push(ch),
                Err(_) => {
                    // Not ours (or corrupt): drop it from the index.
                    tracing::warn!(entry = %name, "presence index entry is not a channel name; removed");
                    let args = [name, claim.clone(), String::new()];
                    let _ = self
                        .run("presence settle", &scripts::INDEX_SETTLE, std::slice::from_ref(&due_key), &args)
                        .await;
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
        add(&self.counters.presence_expired, out.len() as u64);
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
        let keys = [
            k.presence(ch),
            k.presence_exp(ch),
            k.presence_keys(ch),
            k.presence_gone(ch),
            k.presence_gone_exp(ch),
        ];
        let swept = self.run("presence sweep", &scripts::PRESENCE_SWEEP, &keys, &[limit.to_string()]).await;
        let due_key = [self.keys.presence_due()];
        let (next, leases) = match swept {
            Ok(reply) => {
                let mut r = array(reply, "sweep").map_err(malformed)?.into_iter();
                let next = string(r.next().ok_or_else(|| malformed(decode::bad("next")))?, "next")
                    .map_err(malformed)?;
                let recs = array(r.next().ok_or_else(|| malformed(decode::bad("swept")))?, "swept");
                // Removed already: a record that does not parse is logged
                // and skipped, the others still reach the caller.
                let mut leases = Vec::new();
                for rec in recs.map_err(malformed)? {
                    match string(rec, "lease").map_err(malformed).and_then(|s| parse_lease(&s)) {
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
        let args = [ch.to_string(), claim.to_owned(), next];
        if let Err(e) = self.run("presence settle", &scripts::INDEX_SETTLE, &due_key, &args).await {
            // The claim runs out by itself; the channel is swept then.
            tracing::debug!(channel = %ch, error = %e, "presence claim not settled");
        }
        leases
    }
}
