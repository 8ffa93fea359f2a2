//! The bench payload: `{"n":SEQ,"t":MICROS,"p":"xxx…"}`, padded to the
//! requested size. `n` is the publisher's own sequence number for the
//! channel (it lets every peer be checked for loss, duplicates and order,
//! whatever its protocol carries); `t` is the wall-clock time of the publish
//! in microseconds (publisher and subscribers run on the same machine, so
//! one clock serves both).

use serde::Deserialize;

/// The part of a payload the subscriber checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Stamp {
    pub n: u64,
    pub t: u64,
}

/// Wall-clock microseconds since the Unix epoch.
pub fn now_micros() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// A JSON object of exactly `size` bytes (or the shortest possible if
/// `size` is smaller) carrying `n` and the current time.
pub fn encode(n: u64, size: usize) -> Vec<u8> {
    let head = format!("{{\"n\":{n},\"t\":{},\"p\":\"", now_micros());
    let pad = size.saturating_sub(head.len() + 2);
    let mut out = Vec::with_capacity(head.len() + pad + 2);
    out.extend_from_slice(head.as_bytes());
    out.resize(head.len() + pad, b'x');
    out.extend_from_slice(b"\"}");
    out
}

/// The stamp of a payload. Every peer's subscribers decode one per
/// delivery, so the shape `encode` writes is read directly (the numbers,
/// then the padding checked to be all `x`); anything else goes through
/// serde_json, which accepts any JSON object with `n` and `t`.
pub fn decode(json: &[u8]) -> Result<Stamp, serde_json::Error> {
    match decode_encoded(json) {
        Some(stamp) => Ok(stamp),
        None => serde_json::from_slice(json),
    }
}

/// A JSON number at the start of `s` that fits a `u64`, and what follows
/// it; `None` for anything else (leading zeros, signs, fractions, too big:
/// serde_json's to judge).
pub(crate) fn number(s: &[u8]) -> Option<(u64, &[u8])> {
    let len = s.iter().take_while(|b| b.is_ascii_digit()).count();
    if len == 0 || (len > 1 && s[0] == b'0') || s.get(len).is_some_and(|b| matches!(b, b'.' | b'e' | b'E')) {
        return None;
    }
    let n = s[..len].iter().try_fold(0u64, |n, d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))?;
    Some((n, &s[len..]))
}

/// `{"n":N,"t":T,"p":"x…"}` exactly as `encode` writes it, else `None`.
pub(crate) fn decode_encoded(json: &[u8]) -> Option<Stamp> {
    let (n, rest) = number(json.strip_prefix(b"{\"n\":")?)?;
    let (t, rest) = number(rest.strip_prefix(b",\"t\":")?)?;
    let pad = rest.strip_prefix(b",\"p\":\"")?.strip_suffix(b"\"}")?;
    pad.iter().all(|&b| b == b'x').then_some(Stamp { n, t })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_to_the_requested_size_and_decodes() {
        for size in [48, 64, 1024] {
            let p = encode(42, size);
            assert_eq!(p.len(), size);
            let s = decode(&p).unwrap();
            assert_eq!(s.n, 42);
            assert!(now_micros().saturating_sub(s.t) < 10_000_000);
        }
        let tiny = encode(7, 1);
        assert_eq!(decode(&tiny).unwrap().n, 7);
    }

    #[test]
    fn the_direct_reading_agrees_with_serde_json_and_leaves_the_rest_to_it() {
        let encoded = [encode(0, 100), encode(u64::MAX, 100), encode(123_456, 2), encode(9, 4096)];
        for p in &encoded {
            let direct = decode_encoded(p).expect("encode's own shape is read directly");
            assert_eq!(direct, serde_json::from_slice::<Stamp>(p).unwrap());
        }
        // Other shapes: serde_json decides, as before.
        let spaced = br#"{ "n": 5, "t": 6, "p": "xx" }"#;
        assert_eq!(decode_encoded(spaced), None);
        assert_eq!(decode(spaced).unwrap(), Stamp { n: 5, t: 6 });
        let reordered = br#"{"t":6,"n":5}"#;
        assert_eq!(decode(reordered).unwrap(), Stamp { n: 5, t: 6 });
        // Damage is refused, not read past.
        for bad in [
            &br#"{"n":5,"t":6,"p":"xxyx"}"#[..],
            br#"{"n":05,"t":6,"p":"x"}"#,
            br#"{"n":5,"t":6,"p":"x""#,
            br#"{"n":5,"t":,"p":"x"}"#,
            br#"{"n":99999999999999999999,"t":6,"p":"x"}"#,
        ] {
            assert_eq!(decode_encoded(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        assert!(decode(br#"{"n":5,"t":6,"p":"x""#).is_err());
        assert!(decode(br#"{"n":99999999999999999999,"t":6,"p":"x"}"#).is_err());
    }
}
