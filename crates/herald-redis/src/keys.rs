//! The key layout. Every key of one channel carries the hash tag `{channel}`
//! so the scripts that touch them address one slot (no CROSSSLOT under
//! Redis Cluster). Channel names never contain `{` or `}` (see
//! `ChannelName`), so the tag is exactly the channel name.
//!
//! | key | type | contents |
//! |---|---|---|
//! | `herald:{c}:meta` | hash | `epoch`, `seq` (head), `ts` (last message time, ms) |
//! | `herald:{c}:log` | stream | one entry per durable message, id `<seq>-0`, fields `t` (ts), `i` (id), `f` (the frame) |
//! | `herald:{c}:cursors` | hash | subscriber key → `<seq>:<acked_at_ms>` |
//! | `herald:{c}:idem:<key>` | string, TTL | the receipt: `<fingerprint> <seq or -> <id> <ts> <epoch or ->` |
//! | `herald:idem:{<key>}` | string, TTL | the channel that owns a dedup key (cross-channel reuse is a mismatch) |
//! | `herald:user:{<user prefix>}:cursors` | sorted set (score 0) | `<subscriber key>\0<channel>` for every cursor of the user |
//! | `herald:node:{<node id>}` | string, TTL | the node's lease |
//!
//! and the pub/sub channel `herald:{c}:fan` (sharded on a cluster).

use herald_proto::ChannelName;

pub(crate) fn meta(ch: &ChannelName) -> String {
    format!("herald:{{{ch}}}:meta")
}

pub(crate) fn log(ch: &ChannelName) -> String {
    format!("herald:{{{ch}}}:log")
}

pub(crate) fn cursors(ch: &ChannelName) -> String {
    format!("herald:{{{ch}}}:cursors")
}

pub(crate) fn receipt(ch: &ChannelName, key: &str) -> String {
    format!("herald:{{{ch}}}:idem:{key}")
}

/// Which channel a dedup key belongs to. Its own slot: written before the
/// channel's append script, see `engine.rs`.
pub(crate) fn claim(key: &str) -> String {
    format!("herald:idem:{{{key}}}")
}

/// The pub/sub channel of a channel's fan-out.
pub(crate) fn fan(ch: &ChannelName) -> String {
    format!("herald:{{{ch}}}:fan")
}

/// The channel of a fan-out pub/sub channel name.
pub(crate) fn channel_of_fan(name: &[u8]) -> Option<ChannelName> {
    let s = std::str::from_utf8(name).ok()?;
    let inner = s.strip_prefix("herald:{")?.strip_suffix("}:fan")?;
    ChannelName::new(inner).ok()
}

/// The per-user index of cursors; `prefix` is `SubscriberId::user_prefix`.
pub(crate) fn user_index(prefix: &str) -> String {
    format!("herald:user:{{{prefix}}}:cursors")
}

/// A member of the per-user index.
pub(crate) fn user_index_member(subscriber_key: &str, ch: &ChannelName) -> String {
    format!("{subscriber_key}\0{ch}")
}

pub(crate) fn node(id: &str) -> String {
    format!("herald:node:{{{id}}}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_keys_share_one_hash_tag() {
        let ch = ChannelName::new("chat:a-1").unwrap();
        for k in [meta(&ch), log(&ch), cursors(&ch), receipt(&ch, "abc"), fan(&ch)] {
            let tag = k.split_once('{').and_then(|(_, r)| r.split_once('}')).map(|(t, _)| t);
            assert_eq!(tag, Some("chat:a-1"), "{k}");
        }
        assert_eq!(channel_of_fan(fan(&ch).as_bytes()), Some(ch));
        assert_eq!(channel_of_fan(b"herald:{x}:other"), None);
    }
}
