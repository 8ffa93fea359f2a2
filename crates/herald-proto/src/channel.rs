use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Longest channel name in bytes.
pub const MAX_CHANNEL_LEN: usize = 255;

/// A validated channel name: 1..=255 bytes of ASCII letters, digits and
/// `_-.:@=`. The part before the first `:` is the namespace.
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
}

impl ChannelName {
    pub fn new(name: &str) -> Result<Self, ChannelNameError> {
        if name.is_empty() {
            return Err(ChannelNameError::Empty);
        }
        if name.len() > MAX_CHANNEL_LEN {
            return Err(ChannelNameError::TooLong);
        }
        if let Some(pos) = name.bytes().position(|b| !is_channel_byte(b)) {
            return Err(ChannelNameError::BadChar(pos));
        }
        Ok(Self(Arc::from(name)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The namespace: the part before the first `:`, or `""` when the name has
    /// no `:`.
    pub fn namespace(&self) -> &str {
        match self.0.find(':') {
            Some(i) => &self.0[..i],
            None => "",
        }
    }

    /// The part after the first `:` (the whole name when there is none).
    pub fn local_part(&self) -> &str {
        match self.0.find(':') {
            Some(i) => &self.0[i + 1..],
            None => &self.0,
        }
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
}
