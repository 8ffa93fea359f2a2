//! Presence on the writer thread: leases with fencing tokens.
//!
//! A lease lives in `presence` (key `channel \0 member key`) with exactly
//! one entry in the expiry index `presence_exp` (`expires_at ++ presence
//! key`): every change of a lease's expiry deletes the old index entry and
//! puts the new one in the same commit, and removing a lease removes its
//! entry. Each channel's last fencing token is in `presence_tokens`; a join
//! takes the next one and stores it in the same commit as the lease. The
//! counter is never deleted (not when the last lease goes, not when the
//! room closes), so tokens only grow, also across restarts.
//!
//! The writer is the only committer and stages each request against the
//! committed state overlaid with its own batch ([`WriteSet::staged`]), so
//! a token check and the write it guards are one atomic step, and
//! concurrent joins of one member get distinct, increasing tokens.
//!
//! Presence writes cost no fsync of their own, like acks: committed to the
//! OS before the caller is answered (a crash of Herald keeps them) and
//! fsynced within `ack_sync_interval`. Losing that window to an OS crash
//! or power loss can only roll leases and token counters back to a state
//! no live holder depends on: every holder of a token is a connection of
//! this (single-node) process, and none survives the machine.

use std::collections::BTreeMap;
use std::ops::{Bound, ControlFlow};
use std::time::Duration;

use herald_core::{member_key, EngineError, FenceToken, Joined, Lease, Member, Rejoined, Renewed};
use herald_proto::ChannelName;
use tokio::sync::oneshot;

use crate::codec::{self, LeaseRecord};
use crate::gone::Verdict;
use crate::storage::{Space, StorageError, WriteSet};
use crate::writer::{Tally, Writer};

pub(crate) type Reply<T> = oneshot::Sender<Result<T, EngineError>>;

/// A presence request for the writer, with its caller's reply.
pub(crate) enum PresenceCmd {
    Join { channel: ChannelName, member: Member, ttl: Duration, reply: Reply<Joined> },
    Renew { channel: ChannelName, key: String, token: FenceToken, ttl: Duration, reply: Reply<Renewed> },
    Leave { channel: ChannelName, key: String, token: FenceToken, reply: Reply<Option<Lease>> },
    Rejoin { channel: ChannelName, member: Member, token: FenceToken, ttl: Duration, reply: Reply<Rejoined> },
    Expire { limit: usize, reply: Reply<Vec<(ChannelName, Lease)>> },
}

impl PresenceCmd {
    /// The request with a placeholder result, for a batch that fails before
    /// staging it (the placeholder is never sent: the batch answers
    /// `Failed`).
    pub fn unstaged(self) -> PresenceDone {
        let e = EngineError::ShuttingDown;
        match self {
            PresenceCmd::Join { reply, .. } => PresenceDone::Joined(reply, Err(e)),
            PresenceCmd::Renew { reply, .. } => PresenceDone::Renewed(reply, Err(e)),
            PresenceCmd::Leave { reply, .. } => PresenceDone::Left(reply, Err(e)),
            PresenceCmd::Rejoin { reply, .. } => PresenceDone::Rejoined(reply, Err(e)),
            PresenceCmd::Expire { reply, .. } => PresenceDone::Expired(reply, Err(e)),
        }
    }
}

/// A staged presence request: what its caller is told once the batch
/// committed.
pub(crate) enum PresenceDone {
    Joined(Reply<Joined>, Result<Joined, EngineError>),
    Renewed(Reply<Renewed>, Result<Renewed, EngineError>),
    Left(Reply<Option<Lease>>, Result<Option<Lease>, EngineError>),
    Rejoined(Reply<Rejoined>, Result<Rejoined, EngineError>),
    Expired(Reply<Vec<(ChannelName, Lease)>>, Result<Vec<(ChannelName, Lease)>, EngineError>),
}

impl PresenceDone {
    /// Send the result. A dropped receiver is a caller that stopped
    /// waiting; the write stands. (A lease nobody was told about expires
    /// on its own; an expired lease whose caller is gone is never
    /// announced, like a `leave` lost with its node.)
    pub fn answer(self) {
        match self {
            PresenceDone::Joined(reply, r) => drop(reply.send(r)),
            PresenceDone::Renewed(reply, r) => drop(reply.send(r)),
            PresenceDone::Left(reply, r) => drop(reply.send(r)),
            PresenceDone::Rejoined(reply, r) => drop(reply.send(r)),
            PresenceDone::Expired(reply, r) => drop(reply.send(r)),
        }
    }

    pub fn fail(self, reason: &str) {
        let e = EngineError::Failed(reason.to_owned());
        match self {
            PresenceDone::Joined(reply, _) => drop(reply.send(Err(e))),
            PresenceDone::Renewed(reply, _) => drop(reply.send(Err(e))),
            PresenceDone::Left(reply, _) => drop(reply.send(Err(e))),
            PresenceDone::Rejoined(reply, _) => drop(reply.send(Err(e))),
            PresenceDone::Expired(reply, _) => drop(reply.send(Err(e))),
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Writer {
    /// Stage one presence request into `ws`. With a storage error the
    /// batch fails, and the result is a placeholder (never sent).
    pub(crate) fn stage_presence(
        &mut self,
        cmd: PresenceCmd,
        ws: &mut WriteSet,
        tally: &mut Tally,
    ) -> (PresenceDone, Option<StorageError>) {
        fn split<T>(
            r: Result<Result<T, EngineError>, StorageError>,
        ) -> (Result<T, EngineError>, Option<StorageError>) {
            match r {
                Ok(r) => (r, None),
                Err(e) => (Err(EngineError::ShuttingDown), Some(e)),
            }
        }
        match cmd {
            PresenceCmd::Join { channel, member, ttl, reply } => {
                let (r, e) = split(self.stage_join(&channel, member, ttl, ws, tally));
                (PresenceDone::Joined(reply, r), e)
            }
            PresenceCmd::Renew { channel, key, token, ttl, reply } => {
                let (r, e) = split(self.stage_renew(&channel, &key, token, ttl, ws, tally).map(Ok));
                (PresenceDone::Renewed(reply, r), e)
            }
            PresenceCmd::Leave { channel, key, token, reply } => {
                let (r, e) = split(self.stage_leave(&channel, &key, token, ws, tally).map(Ok));
                (PresenceDone::Left(reply, r), e)
            }
            PresenceCmd::Rejoin { channel, member, token, ttl, reply } => {
                let (r, e) = split(self.stage_rejoin(&channel, member, token, ttl, ws, tally));
                (PresenceDone::Rejoined(reply, r), e)
            }
            PresenceCmd::Expire { limit, reply } => {
                let (r, e) = split(self.stage_expire(limit, ws, tally).map(Ok));
                (PresenceDone::Expired(reply, r), e)
            }
        }
    }

    /// The lease at `key` as this batch leaves it.
    fn lease_at(&self, ws: &WriteSet, key: &[u8]) -> Result<Option<LeaseRecord>, StorageError> {
        let v = match ws.staged(Space::Presence, key) {
            Some(staged) => staged.map(<[u8]>::to_vec),
            None => self.shared.storage.get(Space::Presence, key)?,
        };
        Ok(v.map(|v| LeaseRecord::decode(&v)).transpose()?)
    }

    /// Stage `rec` at `key`, moving its expiry index entry from `old_exp`.
    fn put_lease(&self, key: &[u8], rec: &LeaseRecord, old_exp: Option<u64>, ws: &mut WriteSet) {
        // Delete before put: if both index keys are equal the put must win.
        if let Some(old) = old_exp {
            ws.delete(Space::PresenceExp, codec::presence_exp_key(old, key));
        }
        ws.put(Space::Presence, key.to_vec(), rec.encode());
        ws.put(Space::PresenceExp, codec::presence_exp_key(rec.expires_at_ms, key), Vec::new());
    }

    /// Stage the removal of the lease at `key` (expiring at `exp`) and its
    /// index entry.
    pub(crate) fn delete_lease(&self, key: &[u8], exp: u64, ws: &mut WriteSet) {
        ws.delete(Space::Presence, key.to_vec());
        ws.delete(Space::PresenceExp, codec::presence_exp_key(exp, key));
    }

    /// The channel's next fencing token, staged.
    fn next_token(&self, channel: &ChannelName, ws: &mut WriteSet) -> Result<FenceToken, StorageError> {
        let key = channel.as_str().as_bytes();
        let last = match ws.staged(Space::PresenceTokens, key) {
            Some(staged) => staged.map(codec::decode_token).transpose()?,
            None => self
                .shared
                .storage
                .get(Space::PresenceTokens, key)?
                .map(|v| codec::decode_token(&v))
                .transpose()?,
        };
        let token = last.unwrap_or(0) + 1;
        ws.put(Space::PresenceTokens, key.to_vec(), codec::encode_token(token));
        Ok(token)
    }

    fn stage_join(
        &mut self,
        channel: &ChannelName,
        member: Member,
        ttl: Duration,
        ws: &mut WriteSet,
        tally: &mut Tally,
    ) -> Result<Result<Joined, EngineError>, StorageError> {
        // A closed room has no members, and none can come back.
        if self.channel_meta(channel)?.closed {
            tally.closed_refused += 1;
            return Ok(Err(EngineError::Closed));
        }
        let key = codec::presence_key(channel.as_str(), &member_key(&member));
        let old = self.lease_at(ws, &key)?;
        let token = self.next_token(channel, ws)?;
        let expires_at_ms = self.shared.clock.now_ms().saturating_add(ms(ttl));
        let rec = LeaseRecord { token, expires_at_ms, member };
        self.put_lease(&key, &rec, old.as_ref().map(|o| o.expires_at_ms), ws);
        tally.presence_writes += 1;
        let lease = rec.lease();
        Ok(Ok(if old.is_some() { Joined::Reclaimed(lease) } else { Joined::New(lease) }))
    }

    fn stage_renew(
        &mut self,
        channel: &ChannelName,
        member_key: &str,
        token: FenceToken,
        ttl: Duration,
        ws: &mut WriteSet,
        tally: &mut Tally,
    ) -> Result<Renewed, StorageError> {
        let key = codec::presence_key(channel.as_str(), member_key);
        let Some(old) = self.lease_at(ws, &key)? else { return Ok(Renewed::Gone) };
        if old.token != token {
            // Tokens only grow, so a stored token other than the caller's
            // is a later join's.
            return Ok(Renewed::Superseded);
        }
        let old_exp = old.expires_at_ms;
        let expires_at_ms = self.shared.clock.now_ms().saturating_add(ms(ttl));
        let rec = LeaseRecord { expires_at_ms, ..old };
        self.put_lease(&key, &rec, Some(old_exp), ws);
        tally.presence_writes += 1;
        Ok(Renewed::Until(expires_at_ms))
    }

    fn stage_leave(
        &mut self,
        channel: &ChannelName,
        member_key: &str,
        token: FenceToken,
        ws: &mut WriteSet,
        tally: &mut Tally,
    ) -> Result<Option<Lease>, StorageError> {
        let key = codec::presence_key(channel.as_str(), member_key);
        let now = self.shared.clock.now_ms();
        match self.lease_at(ws, &key)? {
            Some(rec) if rec.token == token => {
                self.delete_lease(&key, rec.expires_at_ms, ws);
                tally.presence_writes += 1;
                self.gone.note(channel, member_key, token, true, now);
                Ok(Some(rec.lease()))
            }
            Some(_) => Ok(None),
            None => {
                // Swept already, or never there: a rejoin with this token
                // still in flight must not bring it back.
                if !self.channel_meta(channel)?.closed {
                    self.gone.note(channel, member_key, token, true, now);
                }
                Ok(None)
            }
        }
    }

    fn stage_rejoin(
        &mut self,
        channel: &ChannelName,
        member: Member,
        token: FenceToken,
        ttl: Duration,
        ws: &mut WriteSet,
        tally: &mut Tally,
    ) -> Result<Result<Rejoined, EngineError>, StorageError> {
        if self.channel_meta(channel)?.closed {
            tally.closed_refused += 1;
            return Ok(Err(EngineError::Closed));
        }
        let mkey = member_key(&member);
        let key = codec::presence_key(channel.as_str(), &mkey);
        let now = self.shared.clock.now_ms();
        let expires_at_ms = now.saturating_add(ms(ttl));
        match self.lease_at(ws, &key)? {
            Some(old) if old.token == token => {
                let old_exp = old.expires_at_ms;
                let rec = LeaseRecord { expires_at_ms, ..old };
                self.put_lease(&key, &rec, Some(old_exp), ws);
                tally.presence_writes += 1;
                Ok(Ok(Rejoined::Held(expires_at_ms)))
            }
            Some(_) => Ok(Ok(Rejoined::Fenced)),
            None if self.gone.verdict(channel, &mkey, token, now) == Verdict::Fenced => {
                Ok(Ok(Rejoined::Fenced))
            }
            None => {
                let rec = LeaseRecord { token, expires_at_ms, member };
                self.put_lease(&key, &rec, None, ws);
                tally.presence_writes += 1;
                Ok(Ok(Rejoined::Back(rec.lease())))
            }
        }
    }

    /// Remove up to `limit` expired leases, oldest expiry first. A lease
    /// removed (or re-timed) earlier in the batch is not seen again, so each
    /// expired lease goes to exactly one caller.
    fn stage_expire(
        &mut self,
        limit: usize,
        ws: &mut WriteSet,
        tally: &mut Tally,
    ) -> Result<Vec<(ChannelName, Lease)>, StorageError> {
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        let now = self.shared.clock.now_ms();
        let upper = Bound::Excluded(now.saturating_add(1).to_be_bytes().to_vec());
        let mut due = Vec::new();
        self.shared.storage.scan(Space::PresenceExp, (Bound::Unbounded, upper), |k, _| {
            // Entries this batch already removed are gone for this caller.
            if ws.staged(Space::PresenceExp, k) != Some(None) {
                due.push(k.to_vec());
            }
            Ok(if due.len() >= limit { ControlFlow::Break(()) } else { ControlFlow::Continue(()) })
        })?;
        for exp_key in due {
            let (exp, key) = codec::split_presence_exp_key(&exp_key)?;
            match self.lease_at(ws, key)? {
                Some(rec) if rec.expires_at_ms == exp => {
                    let (channel, _) = codec::split_presence_key(key)?;
                    let channel = ChannelName::new(channel)
                        .map_err(|e| StorageError::Corrupt(format!("lease with a bad channel name: {e}")))?;
                    self.delete_lease(key, exp, ws);
                    let (_, mkey) = codec::split_presence_key(key)?;
                    self.gone.note(&channel, mkey, rec.token, false, now);
                    out.push((channel, rec.lease()));
                }
                // Not the entry of the lease as it stands: drop it. (The
                // index is kept exact, so this is only ever a leftover.)
                _ => ws.delete(Space::PresenceExp, exp_key.clone()),
            }
        }
        tally.presence_expired += out.len() as u64;
        self.gone.prune(now);
        Ok(out)
    }

    /// Every lease of `channel` as this batch leaves it: presence key →
    /// expiry.
    pub(crate) fn channel_leases(
        &self,
        channel: &ChannelName,
        ws: &WriteSet,
    ) -> Result<BTreeMap<Vec<u8>, u64>, StorageError> {
        let prefix = codec::presence_prefix(channel.as_str());
        let mut upper = prefix.clone();
        // `\0` is the separator; `\x01` ends the channel's range.
        *upper.last_mut().expect("prefix ends with the separator") = 1;
        let mut leases = BTreeMap::new();
        self.shared.storage.scan(
            Space::Presence,
            (Bound::Included(prefix.clone()), Bound::Excluded(upper)),
            |k, v| {
                leases.insert(k.to_vec(), LeaseRecord::decode_header(v)?.1);
                Ok(ControlFlow::Continue(()))
            },
        )?;
        for (k, v) in ws.staged_with_prefix(Space::Presence, &prefix) {
            match v {
                Some(v) => leases.insert(k.to_vec(), LeaseRecord::decode_header(v)?.1),
                None => leases.remove(k),
            };
        }
        Ok(leases)
    }
}
