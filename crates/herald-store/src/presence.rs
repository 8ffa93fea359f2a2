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

use herald_core::{
    member_key, EngineError, FenceToken, Joined, Lease, LeaseJoin, LeaseLeave, LeaseRejoin, LeaseRenew,
    Rejoined, Renewed,
};
use herald_proto::ChannelName;

use crate::codec::{self, LeaseRecord};
use crate::gone::Verdict;
use crate::stage::{Stage, Staged, Staging};
use crate::storage::{Read, Space, StorageError, WriteSet};
use crate::writer::Writer;

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// [`Presence::lease_join`](herald_core::Presence::lease_join): a lease
/// with the channel's next token.
impl Stage for LeaseJoin {
    type Ok = Joined;
    type Err = EngineError;
    const FSYNC: bool = false;

    fn stage(self, w: &mut Writer, st: &mut Staging) -> Staged<Self> {
        let LeaseJoin { channel, member, ttl } = self;
        // A closed room has no members, and none can come back.
        if w.channel_meta(&channel)?.closed {
            st.tally.closed_refused += 1;
            return Ok(Err(EngineError::Closed));
        }
        let ws = &mut st.ws;
        let key = codec::presence_key(channel.as_str(), &member_key(&member));
        let old = w.lease_at(ws, &key)?;
        let token = w.next_token(&channel, ws)?;
        let expires_at_ms = w.shared.clock.now_ms().saturating_add(ms(ttl));
        let rec = LeaseRecord { token, expires_at_ms, member };
        put_lease(&key, &rec, old.as_ref().map(|o| o.expires_at_ms), ws);
        st.tally.presence_writes += 1;
        let lease = rec.lease();
        Ok(Ok(if old.is_some() { Joined::Reclaimed(lease) } else { Joined::New(lease) }))
    }
}

/// [`Presence::lease_renew`](herald_core::Presence::lease_renew): a new
/// expiry for the lease of `token`.
impl Stage for LeaseRenew {
    type Ok = Renewed;
    type Err = EngineError;
    const FSYNC: bool = false;

    fn stage(self, w: &mut Writer, st: &mut Staging) -> Staged<Self> {
        let ws = &mut st.ws;
        let key = codec::presence_key(self.channel.as_str(), &self.key);
        let Some(old) = w.lease_at(ws, &key)? else { return Ok(Ok(Renewed::Gone)) };
        if old.token != self.token {
            // Tokens only grow, so a stored token other than the caller's
            // is a later join's.
            return Ok(Ok(Renewed::Superseded));
        }
        let old_exp = old.expires_at_ms;
        let expires_at_ms = w.shared.clock.now_ms().saturating_add(ms(self.ttl));
        let rec = LeaseRecord { expires_at_ms, ..old };
        put_lease(&key, &rec, Some(old_exp), ws);
        st.tally.presence_writes += 1;
        Ok(Ok(Renewed::Until(expires_at_ms)))
    }
}

/// [`Presence::lease_leave`](herald_core::Presence::lease_leave): removes
/// the lease of `token`.
impl Stage for LeaseLeave {
    type Ok = Option<Lease>;
    type Err = EngineError;
    const FSYNC: bool = false;

    fn stage(self, w: &mut Writer, st: &mut Staging) -> Staged<Self> {
        let LeaseLeave { channel, key: member_key, token } = self;
        let key = codec::presence_key(channel.as_str(), &member_key);
        let now = w.shared.clock.now_ms();
        match w.lease_at(&st.ws, &key)? {
            Some(rec) if rec.token == token => {
                delete_lease(&key, rec.expires_at_ms, &mut st.ws);
                st.tally.presence_writes += 1;
                w.gone.note(&channel, &member_key, token, true, now);
                Ok(Ok(Some(rec.lease())))
            }
            Some(_) => Ok(Ok(None)),
            None => {
                // Swept already, or never there: a rejoin with this token
                // still in flight must not bring it back.
                if !w.channel_meta(&channel)?.closed {
                    w.gone.note(&channel, &member_key, token, true, now);
                }
                Ok(Ok(None))
            }
        }
    }
}

/// [`Presence::lease_rejoin`](herald_core::Presence::lease_rejoin): the
/// lease of `token` kept or brought back, unless the removals remembered in
/// `gone.rs` fence it.
impl Stage for LeaseRejoin {
    type Ok = Rejoined;
    type Err = EngineError;
    const FSYNC: bool = false;

    fn stage(self, w: &mut Writer, st: &mut Staging) -> Staged<Self> {
        let LeaseRejoin { channel, member, token, ttl } = self;
        if w.channel_meta(&channel)?.closed {
            st.tally.closed_refused += 1;
            return Ok(Err(EngineError::Closed));
        }
        let mkey = member_key(&member);
        let key = codec::presence_key(channel.as_str(), &mkey);
        let now = w.shared.clock.now_ms();
        let expires_at_ms = now.saturating_add(ms(ttl));
        let ws = &mut st.ws;
        match w.lease_at(ws, &key)? {
            Some(old) if old.token == token => {
                let old_exp = old.expires_at_ms;
                let rec = LeaseRecord { expires_at_ms, ..old };
                put_lease(&key, &rec, Some(old_exp), ws);
                st.tally.presence_writes += 1;
                Ok(Ok(Rejoined::Held(expires_at_ms)))
            }
            Some(_) => Ok(Ok(Rejoined::Fenced)),
            None if w.gone.verdict(&channel, &mkey, token, now) == Verdict::Fenced => {
                Ok(Ok(Rejoined::Fenced))
            }
            None => {
                let rec = LeaseRecord { token, expires_at_ms, member };
                put_lease(&key, &rec, None, ws);
                st.tally.presence_writes += 1;
                Ok(Ok(Rejoined::Back(rec.lease())))
            }
        }
    }
}

/// [`Presence::presence_expire`](herald_core::Presence::presence_expire):
/// removes up to `limit` expired leases, oldest expiry first. A lease removed (or re-timed) earlier in the batch
/// is not seen again, so each expired lease goes to exactly one caller.
pub(crate) struct Expire {
    pub limit: usize,
}

impl Stage for Expire {
    type Ok = Vec<(ChannelName, Lease)>;
    type Err = EngineError;
    const FSYNC: bool = false;

    fn stage(self, w: &mut Writer, st: &mut Staging) -> Staged<Self> {
        let mut out = Vec::new();
        if self.limit == 0 {
            return Ok(Ok(out));
        }
        let ws = &mut st.ws;
        let now = w.shared.clock.now_ms();
        let upper = Bound::Excluded(now.saturating_add(1).to_be_bytes().to_vec());
        let mut due = Vec::new();
        w.shared.storage.scan(Space::PresenceExp, (Bound::Unbounded, upper), |k, _| {
            // Entries this batch already removed are gone for this caller.
            if ws.staged(Space::PresenceExp, k) != Some(None) {
                due.push(k.to_vec());
            }
            Ok(if due.len() >= self.limit { ControlFlow::Break(()) } else { ControlFlow::Continue(()) })
        })?;
        for exp_key in due {
            let (exp, key) = codec::split_presence_exp_key(&exp_key)?;
            match w.lease_at(ws, key)? {
                Some(rec) if rec.expires_at_ms == exp => {
                    let (channel, mkey) = codec::split_presence_key(key)?;
                    let channel = ChannelName::new(channel)
                        .map_err(|e| StorageError::Corrupt(format!("lease with a bad channel name: {e}")))?;
                    delete_lease(key, exp, ws);
                    w.gone.note(&channel, mkey, rec.token, false, now);
                    out.push((channel, rec.lease()));
                }
                // Not the entry of the lease as it stands: drop it. (The
                // index is kept exact, so this is only ever a leftover.)
                _ => ws.delete(Space::PresenceExp, exp_key.clone()),
            }
        }
        st.tally.presence_expired += out.len() as u64;
        w.gone.prune(now);
        Ok(Ok(out))
    }
}

/// Stage `rec` at `key`, moving its expiry index entry from `old_exp`.
fn put_lease(key: &[u8], rec: &LeaseRecord, old_exp: Option<u64>, ws: &mut WriteSet) {
    // Delete before put: if both index keys are equal the put must win.
    if let Some(old) = old_exp {
        ws.delete(Space::PresenceExp, codec::presence_exp_key(old, key));
    }
    ws.put(Space::Presence, key.to_vec(), rec.encode());
    ws.put(Space::PresenceExp, codec::presence_exp_key(rec.expires_at_ms, key), Vec::new());
}

/// Stage the removal of the lease at `key` (expiring at `exp`) and its
/// index entry.
pub(crate) fn delete_lease(key: &[u8], exp: u64, ws: &mut WriteSet) {
    ws.delete(Space::Presence, key.to_vec());
    ws.delete(Space::PresenceExp, codec::presence_exp_key(exp, key));
}

impl Writer {
    /// The lease at `key` as this batch leaves it.
    fn lease_at(&self, ws: &WriteSet, key: &[u8]) -> Result<Option<LeaseRecord>, StorageError> {
        let v = match ws.staged(Space::Presence, key) {
            Some(staged) => staged.map(<[u8]>::to_vec),
            None => self.shared.storage.get(Space::Presence, key)?,
        };
        Ok(v.map(|v| LeaseRecord::decode(&v)).transpose()?)
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
