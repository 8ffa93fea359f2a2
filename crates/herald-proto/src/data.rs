//! What a publish may carry as `data`, checked once at publish time (HTTP,
//! batch and socket alike) so that whatever is stored can always be served.
//!
//! `data` is kept as the exact JSON text the publisher sent (from its first
//! to its last byte: whitespace inside is kept, whitespace around it is not
//! part of it) and never parsed again on the way out, so key order, number
//! spelling and escapes reach subscribers unchanged. The rules here keep it
//! readable by every client:
//!
//! - it is valid JSON (RFC 8259), as parsed by serde_json;
//! - it nests at most `max_depth` arrays/objects (a scalar is depth 0,
//!   `[]` and `{}` depth 1, `{"a":[1]}` depth 2);
//! - no string escapes a lone UTF-16 surrogate (`"\ud800"` alone, or a low
//!   surrogate not preceded by a high one): it names no character, and
//!   strict parsers (serde_json, Go, Python's `encode`) reject or mangle it.
//!
//! Numbers are not limited: `1e400` or a 30-digit integer is stored and
//! served as written. A client that parses `data` into IEEE doubles (every
//! JavaScript client) sees what its parser makes of it.

use serde_json::value::RawValue;

/// The deepest `data` a server may be configured to accept: every document
/// that carries `data` (a history page adds 3 levels above it: the page,
/// `messages`, the message) then stays within 127 levels, what serde_json
/// and other parsers with a 128 limit read.
pub const MAX_DATA_DEPTH_LIMIT: usize = 124;

/// Why `data` was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DataError {
    #[error("`data` nests arrays/objects deeper than {max} levels")]
    TooDeep { max: usize },
    #[error("`data` has a string with a lone UTF-16 surrogate escape (at byte {at})")]
    LoneSurrogate { at: usize },
}

/// Check `data` (already known to be valid JSON: a [`RawValue`]) against
/// the rules of this module. One pass, no recursion, no allocation.
pub fn check_data(data: &RawValue, max_depth: usize) -> Result<(), DataError> {
    check_json_text(data.get().as_bytes(), max_depth)
}

/// [`check_data`] on the bytes of a valid JSON text.
fn check_json_text(b: &[u8], max_depth: usize) -> Result<(), DataError> {
    let mut depth = 0usize;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'[' | b'{' => {
                depth += 1;
                if depth > max_depth {
                    return Err(DataError::TooDeep { max: max_depth });
                }
                i += 1;
            }
            b']' | b'}' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b'"' => i = check_string(b, i + 1)?,
            _ => i += 1,
        }
    }
    Ok(())
}

/// Scan a string whose opening quote is just before `i`; returns the index
/// after its closing quote.
fn check_string(b: &[u8], mut i: usize) -> Result<usize, DataError> {
    // Where the last `\uXXXX` high surrogate ended, waiting for its low half.
    let mut pending_high: Option<usize> = None;
    while i < b.len() {
        match b[i] {
            b'"' => break,
            b'\\' => {
                let at = i;
                let esc = b.get(i + 1).copied();
                if esc == Some(b'u') {
                    let unit = b.get(i + 2..i + 6).and_then(hex4);
                    i += 6;
                    match unit {
                        Some(u) if (0xD800..0xDC00).contains(&u) => {
                            if let Some(h) = pending_high {
                                return Err(DataError::LoneSurrogate { at: h });
                            }
                            pending_high = Some(at);
                            continue;
                        }
                        Some(u) if (0xDC00..0xE000).contains(&u) => {
                            if pending_high.take().is_none() {
                                return Err(DataError::LoneSurrogate { at });
                            }
                            continue;
                        }
                        _ => {}
                    }
                } else {
                    i += 2;
                }
            }
            // Plain characters: nothing to look at before the next quote or
            // backslash (unless a high surrogate waits for its low half,
            // which this character then leaves alone).
            _ if pending_high.is_none() => {
                i = memchr::memchr2(b'"', b'\\', &b[i..]).map_or(b.len(), |n| i + n);
            }
            _ => i += 1,
        }
        if let Some(h) = pending_high {
            return Err(DataError::LoneSurrogate { at: h });
        }
    }
    if let Some(h) = pending_high {
        return Err(DataError::LoneSurrogate { at: h });
    }
    Ok(i + 1)
}

fn hex4(h: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(h).ok()?;
    u32::from_str_radix(s, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, max: usize) -> Result<(), DataError> {
        let raw = RawValue::from_string(text.to_owned()).expect("test data is JSON");
        check_data(&raw, max)
    }

    fn nested(n: usize) -> String {
        "[".repeat(n) + &"]".repeat(n)
    }

    #[test]
    fn depth_counts_arrays_and_objects() {
        assert_eq!(check("1", 0), Ok(()));
        assert_eq!(check("[]", 0), Err(DataError::TooDeep { max: 0 }));
        assert_eq!(check(r#"{"a":[1,{"b":2}]}"#, 3), Ok(()));
        assert_eq!(check(r#"{"a":[1,{"b":2}]}"#, 2), Err(DataError::TooDeep { max: 2 }));
        assert_eq!(check(&nested(64), 64), Ok(()));
        assert_eq!(check(&nested(65), 64), Err(DataError::TooDeep { max: 64 }));
        assert_eq!(check(&nested(5000), 64), Err(DataError::TooDeep { max: 64 }));
        // Brackets inside strings are text.
        assert_eq!(check(r#"["[[[[", "{{{{\"]]"]"#, 1), Ok(()));
        // Siblings do not add up.
        assert_eq!(check("[[1],[2],[3]]", 2), Ok(()));
    }

    #[test]
    fn lone_surrogates_are_refused_and_pairs_kept() {
        assert_eq!(check(r#""\ud83d\ude00""#, 1), Ok(()), "a pair is one character");
        assert_eq!(check(r#""\uD83D\uDE00 and \u00e9 \\ud800""#, 1), Ok(()), "an escaped backslash");
        for bad in [
            r#""\ud800""#,
            r#""\udc00""#,
            r#""x\ud800y""#,
            r#""\ud800\ud800\udc00""#,
            r#""\ud800\u0041""#,
            r#""\ude00\ud83d""#,
            r#"{"k\udfff":1}"#,
            r#"["ok", "\ud800"]"#,
        ] {
            assert!(matches!(check(bad, 8), Err(DataError::LoneSurrogate { .. })), "{bad}");
        }
    }

    #[test]
    fn numbers_beyond_f64_are_accepted_as_written() {
        for n in ["1e400", "-1e400", "123456789012345678901234567890", "0.1000000000000000000000001"] {
            assert_eq!(check(n, 0), Ok(()), "{n}");
        }
    }

    /// The limit leaves room for the deepest envelope around `data`: a
    /// history page at the limit still parses with serde_json's default
    /// recursion limit.
    #[test]
    fn the_depth_limit_fits_common_parsers() {
        let page = format!(r#"{{"messages":[{{"data":{}}}]}}"#, nested(MAX_DATA_DEPTH_LIMIT));
        assert!(serde_json::from_str::<serde_json::Value>(&page).is_ok());
        let deeper = format!(r#"{{"messages":[{{"data":{}}}]}}"#, nested(MAX_DATA_DEPTH_LIMIT + 1));
        assert!(serde_json::from_str::<serde_json::Value>(&deeper).is_err());
    }
}
