//! User and device ids: the one rule every entry point applies (a token's
//! `sub` and `device` claims, `?device=` and dev mode's `?user=`, the
//! `{user}` of HTTP paths, a room's `host`, and `SubscriberId` in
//! herald-core, which keeps cursors under them).

/// Longest user id and longest device id, in bytes.
pub const MAX_ID_LEN: usize = 255;

/// Why a user or device id is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("is empty")]
    Empty,
    #[error("is longer than {MAX_ID_LEN} bytes")]
    TooLong,
    #[error("contains a control character")]
    ControlChar,
}

/// A user or device id is 1..=[`MAX_ID_LEN`] bytes of UTF-8 without control
/// characters (Unicode category Cc: `\0`, `\n`, `\r`, `\t`, DEL, C1 ...).
///
/// Ids end up in storage keys (where `\0` separates fields), in log lines
/// and in other clients' presence lists, so a newline or a NUL must never
/// reach them.
pub fn check_id(id: &str) -> Result<(), IdError> {
    if id.is_empty() {
        return Err(IdError::Empty);
    }
    if id.len() > MAX_ID_LEN {
        return Err(IdError::TooLong);
    }
    if id.chars().any(char::is_control) {
        return Err(IdError::ControlChar);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_bounded_and_printable() {
        assert_eq!(check_id("alice"), Ok(()));
        assert_eq!(check_id("hé llo/☃:1"), Ok(()));
        assert_eq!(check_id(&"x".repeat(MAX_ID_LEN)), Ok(()));
        assert_eq!(check_id(&"x".repeat(MAX_ID_LEN + 1)), Err(IdError::TooLong));
        // 254 bytes plus one 2-byte char: the limit counts bytes.
        assert_eq!(check_id(&format!("{}é", "x".repeat(MAX_ID_LEN - 1))), Err(IdError::TooLong));
        assert_eq!(check_id(""), Err(IdError::Empty));
        for bad in ["a\nb", "a\rb", "\0", "a\tb", "a\u{7f}", "a\u{85}b", "a\u{1b}[31m"] {
            assert_eq!(check_id(bad), Err(IdError::ControlChar), "{bad:?}");
        }
    }
}
