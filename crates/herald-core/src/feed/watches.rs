//! Which channels a node watches, counted.

use std::collections::HashMap;

use herald_proto::ChannelName;

/// The channels a node watches, each with the number of
/// [`watch`](crate::Log::watch) calls not yet balanced by an
/// [`unwatch`](crate::Log::unwatch), and the engine's state for it (its
/// [`Feed`](super::Feed), say). The server calls `watch` once per local
/// subscription and `unwatch` once when it ends, possibly after the `watch`
/// of a later one; counting makes the order of those calls irrelevant: the
/// channel is watched while its count is above zero.
///
/// Pure: the engine keeps it under its own lock.
#[derive(Debug)]
pub struct Watches<T> {
    channels: HashMap<ChannelName, Watched<T>>,
}

#[derive(Debug)]
struct Watched<T> {
    count: usize,
    state: T,
}

impl<T> Default for Watches<T> {
    fn default() -> Self {
        Self { channels: HashMap::new() }
    }
}

impl<T> Watches<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Count one more watch of `channel`, making its state with `make` if
    /// it was not watched. Returns the state.
    pub fn watch(&mut self, channel: &ChannelName, make: impl FnOnce() -> T) -> &T {
        let w = self.channels.entry(channel.clone()).or_insert_with(|| Watched { count: 0, state: make() });
        w.count += 1;
        &w.state
    }

    /// Count one watch of `channel` less. Returns its state when that was
    /// the last one (the channel is no longer watched); `None` otherwise,
    /// also for a channel not watched (nothing to balance).
    pub fn unwatch(&mut self, channel: &ChannelName) -> Option<T> {
        let w = self.channels.get_mut(channel)?;
        w.count -= 1;
        if w.count > 0 {
            return None;
        }
        self.channels.remove(channel).map(|w| w.state)
    }

    pub fn get(&self, channel: &ChannelName) -> Option<&T> {
        self.channels.get(channel).map(|w| &w.state)
    }

    pub fn contains(&self, channel: &ChannelName) -> bool {
        self.channels.contains_key(channel)
    }

    /// How many channels are watched.
    pub fn len(&self) -> usize {
        self.channels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.channels.is_empty()
    }

    /// The state of every watched channel.
    pub fn states(&self) -> impl Iterator<Item = &T> {
        self.channels.values().map(|w| &w.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_unwatch_keeps_a_later_watch() {
        let ch = ChannelName::new("chat:a").unwrap();
        let mut w = Watches::new();
        let mut made = 0;
        w.watch(&ch, || {
            made += 1;
            "feed"
        });
        // A subscriber leaves and another comes; the second watch runs
        // before the first one's unwatch.
        w.watch(&ch, || unreachable!("the channel is watched"));
        assert_eq!(w.unwatch(&ch), None, "one watch is still open");
        assert!(w.contains(&ch));
        assert_eq!(w.unwatch(&ch), Some("feed"), "the last unwatch hands the state back");
        assert!(w.is_empty());
        assert_eq!(w.unwatch(&ch), None, "an unwatch of a channel not watched balances nothing");
        assert_eq!(made, 1);
    }
}
