//! Bans and revocations on the writer thread, and their reads.
//!
//! One space, `control`: `ban\0{user key}\0{device}` (an empty device: the
//! whole user) and `rev\0{user key}`, each holding a time in ms (u64 BE),
//! where the user key is `SubscriberId`'s length-prefixed user part. A
//! write keeps the later of the stored and the new time, so a retried or
//! shorter ban, or an earlier revocation, changes nothing. Ended bans are
//! ignored by the reads and overwritten by the next ban.

use herald_core::{Admission, EngineError};

use crate::stage::{Stage, Staged, Staging};
use crate::storage::{Read, Space, StorageError};
use crate::writer::Writer;

/// Raise the time stored at `key` to `at_ms` (kept if later already).
pub(crate) struct Raise {
    pub key: Vec<u8>,
    pub at_ms: u64,
}

impl Stage for Raise {
    /// The time in force after the write.
    type Ok = u64;
    type Err = EngineError;
    /// A ban or revocation must hold after a crash once answered.
    const FSYNC: bool = true;

    fn stage(self, w: &mut Writer, st: &mut Staging) -> Staged<Self> {
        let stored = match st.ws.staged(Space::Control, &self.key) {
            Some(v) => v.map(<[u8]>::to_vec),
            None => w.shared.storage.get(Space::Control, &self.key)?,
        };
        let stored = stored.as_deref().map(decode).transpose()?;
        let at = stored.map_or(self.at_ms, |s| s.max(self.at_ms));
        if stored != Some(at) {
            st.ws.put(Space::Control, self.key, at.to_be_bytes().to_vec());
        }
        Ok(Ok(at))
    }
}

fn user_key(user: &str) -> String {
    format!("{}:{user}", user.len())
}

pub(crate) fn ban_key(user: &str, device: Option<&str>) -> Vec<u8> {
    format!("ban\0{}\0{}", user_key(user), device.unwrap_or("")).into_bytes()
}

pub(crate) fn revoke_key(user: &str) -> Vec<u8> {
    format!("rev\0{}", user_key(user)).into_bytes()
}

fn decode(v: &[u8]) -> Result<u64, StorageError> {
    let bytes: [u8; 8] =
        v.try_into().map_err(|_| StorageError::Corrupt("control entry: not a u64".into()))?;
    Ok(u64::from_be_bytes(bytes))
}

/// What is stored against `user` and `device` at `now_ms`.
pub(crate) fn admission(
    r: &impl Read,
    user: &str,
    device: Option<&str>,
    now_ms: u64,
) -> Result<Admission, StorageError> {
    let mut banned = None;
    let mut keys = vec![ban_key(user, None)];
    if let Some(d) = device.filter(|d| !d.is_empty()) {
        keys.push(ban_key(user, Some(d)));
    }
    for key in keys {
        if let Some(until) = r.get(Space::Control, &key)?.as_deref().map(decode).transpose()? {
            if until > now_ms {
                banned = banned.max(Some(until));
            }
        }
    }
    let revoked = r.get(Space::Control, &revoke_key(user))?.as_deref().map(decode).transpose()?;
    Ok(Admission { banned_until_ms: banned, revoked_before_ms: revoked })
}
