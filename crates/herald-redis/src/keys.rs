//! The key layout. Every key of one channel carries the hash tag `{channel}`
//! so the scripts that touch them address one slot (no CROSSSLOT under
//! Redis Cluster). Channel names never contain `{` or `}` (see
//! `ChannelName`), so the tag is exactly the channel name. Every key starts
//! with the configured prefix `p` (default `herald`), so several
//! deployments (or test fixtures) can share one Redis without seeing each
//! other.
//!
//! | key | type | contents |
//! |---|---|---|
//! | `p:{c}:meta` | hash | `epoch`, `seq` (head), `ts` (last message time, ms), `closed` (`1` once closed) |
//! | `p:{c}:log` | stream | one entry per durable message, id `<seq>-0`, fields `t` (ts), `i` (id), `f` (the frame) |
//! | `p:{c}:cursors` | hash | subscriber key → `<seq>:<acked_at_ms>` |
//! | `p:{c}:idem:<key>` | string, TTL | the receipt: `<fingerprint> <seq or -> <id> <ts> <epoch or ->` |
//! | `p:{c}:presence` | hash | member key → `<token> <expires_at_ms> <member JSON>` |
//! | `p:{c}:presence:exp` | sorted set | member key, scored by `expires_at_ms` |
//! | `p:{c}:presence:keys` | sorted set (score 0) | member key (lex order: listing, and a user's leases by prefix) |
//! | `p:{c}:presence:token` | string | the channel's last fencing token (never deleted) |
//! | `p:{c}:presence:gone` | hash | member key → `<token> <l|s>`: its last removal (left or swept), for rejoins |
//! | `p:{c}:presence:gone:exp` | sorted set | member key of `presence:gone`, scored by when it is forgotten (ms) |
//! | `p:{c}:room` | hash | `version`, `record` (the room as JSON) |
//! | `p:idem:{<key>}` | string, TTL | the channel that owns a dedup key (cross-channel reuse is a mismatch) |
//! | `p:user:{<user prefix>}:cursors` | sorted set (score 0) | `<subscriber key>\0<channel>` for every cursor of the user |
//! | `p:node:{<node id>}` | string, TTL | the node's lease |
//! | `p:presence:due` | sorted set | channel, scored by when it should be swept next (at or before its earliest lease expiry) |
//! | `p:rooms:active` | sorted set (score 0) | channel of every room not known to be closed |
//! | `p:{c}:sched` | hash | schedule id → record (JSON: deliver_at, created_at, data, meta) |
//! | `p:{c}:sched:idx` | sorted set | schedule id, scored by `deliver_at` (listing) |
//! | `p:{c}:sched:claims` | hash | schedule id → `<fencing token> <claim until ms>` |
//! | `p:{c}:sched:idem:<key>` | string, TTL | a schedule's receipt: `<fingerprint> <id> <deliver_at>` |
//! | `p:{sched}:due` | sorted set | `<id> <channel>` of every pending schedule, scored by `deliver_at` |
//! | `p:{sched}:where` | hash | schedule id → channel (cancel by id) |
//!
//! and the pub/sub channel `p:{c}:fan` (sharded on a cluster).

use std::sync::Arc;

use herald_proto::ChannelName;

/// The keys of a channel's leases that every script removing a lease
/// changes together: the leases, their expiries, their key index, and the
/// remembered removals with their expiries.
pub(crate) struct LeaseKeys {
    pub presence: String,
    pub presence_exp: String,
    pub presence_keys: String,
    /// Removed leases, for rejoins: member key → `<token> <l|s>` (left or
    /// swept).
    pub presence_gone: String,
    /// When each entry of `presence_gone` is forgotten (ms).
    pub presence_gone_exp: String,
}

/// Names every key under one prefix. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: Arc<str>,
}

impl Keys {
    pub fn new(prefix: &str) -> Self {
        Self { prefix: Arc::from(prefix) }
    }

    /// The configured prefix (`p`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn channel_key(&self, ch: &ChannelName, what: &str) -> String {
        let mut out = Vec::with_capacity(self.prefix.len() + ch.as_str().len() + what.len() + 4);
        self.write_channel_key(&mut out, ch, what);
        String::from_utf8(out).expect("keys are built from strings")
    }

    /// `p:{c}:what`, appended to `out` (a script argument being built).
    pub fn write_channel_key(&self, out: &mut Vec<u8>, ch: &ChannelName, what: &str) {
        for part in [self.prefix.as_bytes(), b":{", ch.as_str().as_bytes(), b"}:", what.as_bytes()] {
            out.extend_from_slice(part);
        }
    }

    pub fn meta(&self, ch: &ChannelName) -> String {
        self.channel_key(ch, "meta")
    }

    pub fn log(&self, ch: &ChannelName) -> String {
        self.channel_key(ch, "log")
    }

    pub fn cursors(&self, ch: &ChannelName) -> String {
        self.channel_key(ch, "cursors")
    }

    #[cfg(test)]
    pub fn receipt(&self, ch: &ChannelName, key: &str) -> String {
        let mut out = Vec::new();
        self.write_receipt(&mut out, ch, key);
        String::from_utf8(out).expect("keys are built from strings")
    }

    /// A message's receipt under its dedup key (`p:{c}:idem:key`),
    /// appended to `out`.
    pub fn write_receipt(&self, out: &mut Vec<u8>, ch: &ChannelName, key: &str) {
        self.write_channel_key(out, ch, "idem:");
        out.extend_from_slice(key.as_bytes());
    }

    /// Which channel a dedup key belongs to. Its own slot: written before the
    /// channel's append script, see `append.rs`.
    pub fn claim(&self, key: &str) -> String {
        format!("{}:idem:{{{key}}}", self.prefix)
    }

    /// The pub/sub channel of a channel's fan-out.
    pub fn fan(&self, ch: &ChannelName) -> String {
        self.channel_key(ch, "fan")
    }

    /// The channel of a fan-out pub/sub channel name.
    pub fn channel_of_fan(&self, name: &[u8]) -> Option<ChannelName> {
        let s = std::str::from_utf8(name).ok()?;
        let inner = s.strip_prefix(&*self.prefix)?.strip_prefix(":{")?.strip_suffix("}:fan")?;
        ChannelName::new(inner).ok()
    }

    /// The per-user index of cursors; `user_prefix` is `SubscriberId::user_prefix`.
    pub fn user_index(&self, user_prefix: &str) -> String {
        format!("{}:user:{{{user_prefix}}}:cursors", self.prefix)
    }

    /// A work lease of `herald_core::Ownership` (the holder and its token),
    /// and its token counter, in one hash slot.
    pub fn owner(&self, key: &str) -> (String, String) {
        (format!("{}:own:{{{key}}}", self.prefix), format!("{}:own:{{{key}}}:token", self.prefix))
    }

    pub fn node(&self, id: &str) -> String {
        format!("{}:node:{{{id}}}", self.prefix)
    }

    /// The leases of a channel's members.
    pub fn presence(&self, ch: &ChannelName) -> String {
        self.channel_key(ch, "presence")
    }

    pub fn presence_exp(&self, ch: &ChannelName) -> String {
        self.channel_key(ch, "presence:exp")
    }

    pub fn presence_keys(&self, ch: &ChannelName) -> String {
        self.channel_key(ch, "presence:keys")
    }

    pub fn presence_token(&self, ch: &ChannelName) -> String {
        self.channel_key(ch, "presence:token")
    }

    /// The lease keys of `ch` that removals change together.
    pub fn leases(&self, ch: &ChannelName) -> LeaseKeys {
        LeaseKeys {
            presence: self.presence(ch),
            presence_exp: self.presence_exp(ch),
            presence_keys: self.presence_keys(ch),
            presence_gone: self.channel_key(ch, "presence:gone"),
            presence_gone_exp: self.channel_key(ch, "presence:gone:exp"),
        }
    }

    pub fn room(&self, ch: &ChannelName) -> String {
        self.channel_key(ch, "room")
    }

    /// The global index of channels with leases. One key (one slot, one
    /// cluster node), written next to the channel scripts.
    pub fn presence_due(&self) -> String {
        format!("{}:presence:due", self.prefix)
    }

    /// A channel's schedules, their index and their claims.
    pub fn sched(&self, ch: &ChannelName) -> String {
        self.channel_key(ch, "sched")
    }

    pub fn sched_idx(&self, ch: &ChannelName) -> String {
        self.channel_key(ch, "sched:idx")
    }

    pub fn sched_claims(&self, ch: &ChannelName) -> String {
        self.channel_key(ch, "sched:claims")
    }

    pub fn sched_receipt(&self, ch: &ChannelName, key: &str) -> String {
        format!("{}:{{{ch}}}:sched:idem:{key}", self.prefix)
    }

    /// The global order of delivery, and where each schedule lives: one
    /// slot, written before the channel's schedule script.
    pub fn sched_due(&self) -> String {
        format!("{}:{{sched}}:due", self.prefix)
    }

    pub fn sched_where(&self) -> String {
        format!("{}:{{sched}}:where", self.prefix)
    }

    /// The global index of rooms that are not closed.
    pub fn rooms_active(&self) -> String {
        format!("{}:rooms:active", self.prefix)
    }
}

/// A member of the per-user index.
pub(crate) fn user_index_member(subscriber_key: &str, ch: &ChannelName) -> String {
    format!("{subscriber_key}\0{ch}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_keys_share_one_hash_tag() {
        let keys = Keys::new("hx");
        let ch = ChannelName::new("chat:a-1").unwrap();
        for k in [
            keys.meta(&ch),
            keys.log(&ch),
            keys.cursors(&ch),
            keys.receipt(&ch, "abc"),
            keys.fan(&ch),
            keys.presence(&ch),
            keys.presence_exp(&ch),
            keys.presence_keys(&ch),
            keys.presence_token(&ch),
            keys.room(&ch),
            keys.sched(&ch),
            keys.sched_idx(&ch),
            keys.sched_claims(&ch),
            keys.sched_receipt(&ch, "abc"),
        ] {
            assert!(k.starts_with("hx:"), "{k}");
            let tag = k.split_once('{').and_then(|(_, r)| r.split_once('}')).map(|(t, _)| t);
            assert_eq!(tag, Some("chat:a-1"), "{k}");
        }
        assert_eq!(keys.sched_due(), "hx:{sched}:due");
        assert_eq!(keys.sched_where(), "hx:{sched}:where", "the global schedule keys share one slot");
        assert_eq!(keys.channel_of_fan(keys.fan(&ch).as_bytes()), Some(ch.clone()));
        assert_eq!(keys.channel_of_fan(b"hx:{x}:other"), None);
        assert_eq!(Keys::new("herald").channel_of_fan(keys.fan(&ch).as_bytes()), None, "another prefix");
    }
}
