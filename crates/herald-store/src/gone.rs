//! What the writer remembers of removed leases, for
//! [`presence_rejoin`](herald_core::Presence::presence_rejoin): per member,
//! the token of its last removed lease and whether its holder left (a
//! leave) or was swept (expired while it could not renew).
//!
//! In memory, on the writer thread. That is enough here: a fencing token is
//! only ever held by a session of this process, so a restart (which ends
//! every session) forgets nothing any holder could still use. Each entry is
//! kept [`GONE_MEMORY`] after its removal, and at most [`GONE_CAP`] per
//! channel (the oldest go first); `prune` drops what is due.

use std::collections::{BTreeMap, HashMap};

use herald_core::{FenceToken, GONE_CAP, GONE_MEMORY};
use herald_proto::ChannelName;

/// One member's last removal.
#[derive(Debug, Clone, Copy)]
struct Tomb {
    token: FenceToken,
    /// Removed by (or after) a leave with `token`.
    left: bool,
    /// Forgotten from this time (ms).
    until_ms: u64,
    /// Insertion number, to order entries with one `until_ms`.
    n: u64,
}

#[derive(Default)]
struct ChannelGone {
    by_key: HashMap<String, Tomb>,
    /// `(until_ms, n)` → member key: what goes first.
    by_until: BTreeMap<(u64, u64), String>,
}

impl ChannelGone {
    fn remove_oldest(&mut self) {
        if let Some((_, key)) = self.by_until.pop_first() {
            self.by_key.remove(&key);
        }
    }

    fn prune(&mut self, now_ms: u64) {
        while self.by_until.first_key_value().is_some_and(|((until, _), _)| *until <= now_ms) {
            self.remove_oldest();
        }
    }
}

/// What a rejoin with a token may do, as far as the removals say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing newer is remembered: the lease may come back.
    Allowed,
    /// The holder left, or a later token of the member was removed since.
    Fenced,
}

#[derive(Default)]
pub(crate) struct GoneBook {
    channels: HashMap<ChannelName, ChannelGone>,
    next: u64,
}

impl GoneBook {
    /// Remember that `key`'s lease with `token` was removed (`left`: by a
    /// leave with `token`, or a leave with `token` came after). A removal
    /// remembered with a greater token stays.
    pub fn note(&mut self, channel: &ChannelName, key: &str, token: FenceToken, left: bool, now_ms: u64) {
        let ch = self.channels.entry(channel.clone()).or_default();
        ch.prune(now_ms);
        let left = match ch.by_key.get(key) {
            Some(t) if t.token > token => return,
            Some(t) => {
                ch.by_until.remove(&(t.until_ms, t.n));
                left || (t.token == token && t.left)
            }
            None => left,
        };
        self.next += 1;
        let until_ms = now_ms.saturating_add(GONE_MEMORY.as_millis() as u64);
        let tomb = Tomb { token, left, until_ms, n: self.next };
        ch.by_until.insert((until_ms, tomb.n), key.to_owned());
        ch.by_key.insert(key.to_owned(), tomb);
        while ch.by_key.len() > GONE_CAP {
            ch.remove_oldest();
        }
    }

    /// May the holder of `token` get `key`'s lease back?
    pub fn verdict(&mut self, channel: &ChannelName, key: &str, token: FenceToken, now_ms: u64) -> Verdict {
        let Some(ch) = self.channels.get_mut(channel) else { return Verdict::Allowed };
        ch.prune(now_ms);
        match ch.by_key.get(key) {
            Some(t) if t.token > token || (t.token == token && t.left) => Verdict::Fenced,
            _ => Verdict::Allowed,
        }
    }

    /// Drop everything due, on every channel.
    pub fn prune(&mut self, now_ms: u64) {
        self.channels.retain(|_, ch| {
            ch.prune(now_ms);
            !ch.by_key.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ch() -> ChannelName {
        ChannelName::new("chat:x").unwrap()
    }

    #[test]
    fn a_later_token_or_a_leave_fences_and_memory_runs_out() {
        let mut g = GoneBook::default();
        let (c, now) = (ch(), 1_000);
        assert_eq!(g.verdict(&c, "k", 5, now), Verdict::Allowed, "nothing remembered");
        g.note(&c, "k", 5, false, now);
        assert_eq!(g.verdict(&c, "k", 5, now), Verdict::Allowed, "swept: its holder may come back");
        assert_eq!(g.verdict(&c, "k", 4, now), Verdict::Fenced, "an earlier holder may not");
        g.note(&c, "k", 5, true, now);
        assert_eq!(g.verdict(&c, "k", 5, now), Verdict::Fenced, "its holder left");
        g.note(&c, "k", 5, false, now);
        assert_eq!(g.verdict(&c, "k", 5, now), Verdict::Fenced, "a later sweep keeps the leave");
        g.note(&c, "k", 3, true, now);
        assert_eq!(g.verdict(&c, "k", 7, now), Verdict::Allowed, "older removals do not fence");
        let later = now + GONE_MEMORY.as_millis() as u64;
        assert_eq!(g.verdict(&c, "k", 5, later), Verdict::Allowed, "forgotten after GONE_MEMORY");
        g.prune(later);
        assert!(g.channels.is_empty());
    }

    #[test]
    fn each_channel_keeps_at_most_the_cap() {
        let mut g = GoneBook::default();
        let c = ch();
        for i in 0..(GONE_CAP as u64 + 10) {
            g.note(&c, &format!("k{i}"), i + 1, true, 1_000 + i);
        }
        assert_eq!(g.channels[&c].by_key.len(), GONE_CAP);
        assert_eq!(g.verdict(&c, "k0", 1, 2_000), Verdict::Allowed, "the oldest went first");
        assert_eq!(g.verdict(&c, "k20", 21, 2_000), Verdict::Fenced);
    }
}
