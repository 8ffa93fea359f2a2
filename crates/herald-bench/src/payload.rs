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

pub fn decode(json: &[u8]) -> Result<Stamp, serde_json::Error> {
    serde_json::from_slice(json)
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
}
