use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Longest channel name in bytes.
pub const MAX_CHANNEL_LEN: usize = 255;

/// Most user ids after a channel name's `#`.
pub const MAX_LIMITED_USERS: usize = 16;

/// A validated channel name: 1..=255 bytes of ASCII letters, digits and
/// `_-.:@=`, optionally followed by `#` and 1..=[`MAX_LIMITED_USERS`] user
/// ids separated by `,`, each of ASCII letters, digits and `_-.@=` (the
/// user-limited form, `dm:chat#42,43`; its meaning is the namespace's
/// `allow_user_limited`). The part before the first `:` is the namespace.
///
/// Cheap to clone (shared string). Names never contain `\0`, which the
/// embedded engine relies on as a key separator.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct ChannelName(Arc<str>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelNameError {
    #[error("channel name is empty")]
    Empty,
    #[error("channel name is longer than {MAX_CHANNEL_LEN} bytes")]
    TooLong,
    #[error("channel name has a character outside ASCII letters, digits and _-.:@= (at byte {0})")]
    BadChar(usize),
    #[error(
        "after `#` a channel name lists 1..={MAX_LIMITED_USERS} user ids separated by `,`, \
         each of ASCII letters, digits and _-.@="
    )]
    BadUserList,
}

impl ChannelName {
    pub fn new(name: &str) -> Result<Self, ChannelNameError> {
        if name.is_empty() {
            return Err(ChannelNameError::Empty);
        }
        if name.len() > MAX_CHANNEL_LEN {
            return Err(ChannelNameError::TooLong);
        }
        // A byte scan, as in `colon`: `#` is ASCII, so the index is a char
        // boundary, and a name is parsed on every frame that carries one.
        let (base, users) = match name.bytes().position(|b| b == b'#') {
            Some(i) => (&name[..i], Some(&name[i + 1..])),
            None => (name, None),
        };
        if base.is_empty() {
            return Err(ChannelNameError::Empty);
        }
        if let Some(pos) = base.bytes().position(|b| !is_channel_byte(b)) {
            return Err(ChannelNameError::BadChar(pos));
        }
        if let Some(users) = users {
            let mut n = 0;
            for id in users.split(',') {
                n += 1;
                if id.is_empty()
                    || n > MAX_LIMITED_USERS
                    || !id.bytes().all(|b| is_channel_byte(b) && b != b':')
                {
                    return Err(ChannelNameError::BadUserList);
                }
            }
        }
        Ok(Self(Arc::from(name)))
    }

    /// The user ids after `#`, if the name has the user-limited form.
    pub fn limited_users(&self) -> Option<std::str::Split<'_, char>> {
        self.0.split_once('#').map(|(_, users)| users.split(','))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The namespace: the part before the first `:`, or `""` when the name has
    /// no `:`.
    pub fn namespace(&self) -> &str {
        match self.colon() {
            Some(i) => &self.0[..i],
            None => "",
        }
    }

    /// The part after the first `:` (the whole name when there is none).
    pub fn local_part(&self) -> &str {
        match self.colon() {
            Some(i) => &self.0[i + 1..],
            None => &self.0,
        }
    }

    /// Where the first `:` is. A byte scan: names are short, and a plain
    /// loop over a few bytes costs a fraction of `str::find`'s searcher on
    /// every publish and delivery (`:` is ASCII, so the index is a char
    /// boundary).
    fn colon(&self) -> Option<usize> {
        self.0.bytes().position(|b| b == b':')
    }
}

fn is_channel_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':' | b'@' | b'=')
}

impl fmt::Display for ChannelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ChannelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl AsRef<str> for ChannelName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for ChannelName {
    type Err = ChannelNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl<'de> Deserialize<'de> for ChannelName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        ChannelName::new(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_alphabet() {
        let c = ChannelName::new("chat:s-789_a.b@c=d").unwrap();
        assert_eq!(c.namespace(), "chat");
        assert_eq!(c.local_part(), "s-789_a.b@c=d");
        assert_eq!(ChannelName::new("plain").unwrap().namespace(), "");
        assert_eq!(ChannelName::new("a:b:c").unwrap().namespace(), "a");
    }

    #[test]
    fn rejects_bad_names() {
        assert_eq!(ChannelName::new(""), Err(ChannelNameError::Empty));
        assert_eq!(ChannelName::new("chat:a b"), Err(ChannelNameError::BadChar(6)));
        assert_eq!(ChannelName::new("chat:\0"), Err(ChannelNameError::BadChar(5)));
        assert_eq!(ChannelName::new("chat:é"), Err(ChannelNameError::BadChar(5)));
        assert!(ChannelName::new(&"a".repeat(255)).is_ok());
        assert_eq!(ChannelName::new(&"a".repeat(256)), Err(ChannelNameError::TooLong));
    }

    #[test]
    fn the_user_limited_form() {
        let c = ChannelName::new("dm:chat#42,alice@x.y").unwrap();
        assert_eq!(c.namespace(), "dm");
        assert_eq!(c.limited_users().unwrap().collect::<Vec<_>>(), ["42", "alice@x.y"]);
        assert!(ChannelName::new("chat:plain").unwrap().limited_users().is_none());
        let sixteen = (0..16).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        assert!(ChannelName::new(&format!("dm:x#{sixteen}")).is_ok());
        for bad in ["dm:x#", "dm:x#1,", "dm:x#,1", "dm:x#1,,2", "dm:x#1#2", "dm:x#a:b", "dm:x#a b"] {
            assert_eq!(ChannelName::new(bad), Err(ChannelNameError::BadUserList), "{bad}");
        }
        assert_eq!(ChannelName::new(&format!("dm:x#{sixteen},16")), Err(ChannelNameError::BadUserList));
        assert_eq!(ChannelName::new("#1"), Err(ChannelNameError::Empty));
        assert_eq!(ChannelName::new("dm,x#1"), Err(ChannelNameError::BadChar(2)));
    }
}
