//! A connection's subscriptions by channel: a map sized for the common
//! case, one or a few subscriptions per connection.
//!
//! A `HashMap` with one entry allocates room for four (about 300 bytes per
//! connection here); up to `FEW` subscriptions live in a `Vec` grown one
//! entry at a time and searched in order, past that in a `HashMap`. Same
//! operations, same results; iteration order is unspecified in both.

use std::collections::HashMap;

use herald_proto::ChannelName;

/// Subscriptions kept in a `Vec` before the map switches to a `HashMap`.
const FEW: usize = 8;

pub(super) enum SubMap<V> {
    Few(Vec<(ChannelName, V)>),
    Many(HashMap<ChannelName, V>),
}

impl<V> Default for SubMap<V> {
    fn default() -> Self {
        SubMap::Few(Vec::new())
    }
}

impl<V> SubMap<V> {
    pub fn len(&self) -> usize {
        match self {
            SubMap::Few(v) => v.len(),
            SubMap::Many(m) => m.len(),
        }
    }

    pub fn contains_key(&self, channel: &ChannelName) -> bool {
        self.get(channel).is_some()
    }

    pub fn get(&self, channel: &ChannelName) -> Option<&V> {
        match self {
            SubMap::Few(v) => v.iter().find(|(c, _)| c == channel).map(|(_, s)| s),
            SubMap::Many(m) => m.get(channel),
        }
    }

    pub fn get_mut(&mut self, channel: &ChannelName) -> Option<&mut V> {
        match self {
            SubMap::Few(v) => v.iter_mut().find(|(c, _)| c == channel).map(|(_, s)| s),
            SubMap::Many(m) => m.get_mut(channel),
        }
    }

    /// Insert or replace; returns the value replaced.
    pub fn insert(&mut self, channel: ChannelName, value: V) -> Option<V> {
        match self {
            SubMap::Few(v) => {
                if let Some(slot) = v.iter_mut().find(|(c, _)| *c == channel) {
                    return Some(std::mem::replace(&mut slot.1, value));
                }
                if v.len() < FEW {
                    // One entry at a time: a first push would make room for four.
                    v.reserve_exact(1);
                    v.push((channel, value));
                    return None;
                }
                let mut m: HashMap<ChannelName, V> = std::mem::take(v).into_iter().collect();
                m.insert(channel, value);
                *self = SubMap::Many(m);
                None
            }
            SubMap::Many(m) => m.insert(channel, value),
        }
    }

    pub fn remove(&mut self, channel: &ChannelName) -> Option<V> {
        match self {
            SubMap::Few(v) => {
                let i = v.iter().position(|(c, _)| c == channel)?;
                Some(v.swap_remove(i).1)
            }
            SubMap::Many(m) => m.remove(channel),
        }
    }

    pub fn iter(&self) -> Iter<'_, V> {
        match self {
            SubMap::Few(v) => Iter::Few(v.iter()),
            SubMap::Many(m) => Iter::Many(m.iter()),
        }
    }

    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.iter().map(|(_, s)| s)
    }
}

pub(super) enum Iter<'a, V> {
    Few(std::slice::Iter<'a, (ChannelName, V)>),
    Many(std::collections::hash_map::Iter<'a, ChannelName, V>),
}

impl<'a, V> Iterator for Iter<'a, V> {
    type Item = (&'a ChannelName, &'a V);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Iter::Few(i) => i.next().map(|(c, s)| (c, s)),
            Iter::Many(i) => i.next(),
        }
    }
}

pub(super) enum IntoIter<V> {
    Few(std::vec::IntoIter<(ChannelName, V)>),
    Many(std::collections::hash_map::IntoIter<ChannelName, V>),
}

impl<V> Iterator for IntoIter<V> {
    type Item = (ChannelName, V);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            IntoIter::Few(i) => i.next(),
            IntoIter::Many(i) => i.next(),
        }
    }
}

impl<V> IntoIterator for SubMap<V> {
    type Item = (ChannelName, V);
    type IntoIter = IntoIter<V>;

    fn into_iter(self) -> IntoIter<V> {
        match self {
            SubMap::Few(v) => IntoIter::Few(v.into_iter()),
            SubMap::Many(m) => IntoIter::Many(m.into_iter()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ch(i: usize) -> ChannelName {
        ChannelName::new(&format!("chat:c{i}")).unwrap()
    }

    #[test]
    fn behaves_as_a_map_below_and_above_the_switch() {
        let mut m: SubMap<usize> = SubMap::default();
        let mut model: HashMap<ChannelName, usize> = HashMap::new();
        for round in 0..3 {
            for i in 0..2 * FEW {
                assert_eq!(m.insert(ch(i), i + round), model.insert(ch(i), i + round));
                assert_eq!(m.len(), model.len());
            }
            for i in (0..2 * FEW).step_by(3) {
                assert_eq!(m.remove(&ch(i)), model.remove(&ch(i)));
                assert_eq!(m.remove(&ch(i)), None);
            }
            for i in 0..2 * FEW + 1 {
                assert_eq!(m.get(&ch(i)), model.get(&ch(i)));
                assert_eq!(m.contains_key(&ch(i)), model.contains_key(&ch(i)));
                if let Some(v) = m.get_mut(&ch(i)) {
                    *v += 1;
                    *model.get_mut(&ch(i)).unwrap() += 1;
                }
            }
            let mut seen: Vec<_> = m.iter().map(|(c, v)| (c.clone(), *v)).collect();
            let mut want: Vec<_> = model.iter().map(|(c, v)| (c.clone(), *v)).collect();
            seen.sort();
            want.sort();
            assert_eq!(seen, want);
            assert_eq!(m.values().count(), model.len());
        }
        let mut all: Vec<_> = std::mem::take(&mut m).into_iter().collect();
        all.sort();
        let mut want: Vec<_> = model.into_iter().collect();
        want.sort();
        assert_eq!(all, want);
        assert_eq!(m.len(), 0);
    }

    #[test]
    fn a_few_subscriptions_take_room_for_exactly_that_many() {
        let mut m: SubMap<u64> = SubMap::default();
        m.insert(ch(0), 0);
        let SubMap::Few(v) = &m else { panic!("one subscription is few") };
        assert_eq!(v.capacity(), 1);
    }
}
