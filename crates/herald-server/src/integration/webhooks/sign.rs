//! The request body and its signature.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use herald_core::Message;

/// `{"webhook","channel","epoch","messages":[...]}`: each element of
/// `messages` is the message's stored frame, byte for byte (`type`,
/// `channel`, `seq`, `id`, `ts`, `data` or `member`, `meta`), so `data` is
/// exactly what was published.
pub fn body(webhook: &str, channel: &str, epoch: &str, messages: &[std::sync::Arc<Message>]) -> Vec<u8> {
    let frames: usize = messages.iter().map(|m| m.frame.len() + 1).sum();
    let mut out = Vec::with_capacity(frames + webhook.len() + channel.len() + epoch.len() + 64);
    out.extend_from_slice(b"{\"webhook\":");
    serde_json::to_writer(&mut out, webhook).expect("strings serialise");
    out.extend_from_slice(b",\"channel\":");
    serde_json::to_writer(&mut out, channel).expect("strings serialise");
    out.extend_from_slice(b",\"epoch\":");
    serde_json::to_writer(&mut out, epoch).expect("strings serialise");
    out.extend_from_slice(b",\"messages\":[");
    for (i, m) in messages.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&m.frame);
    }
    out.extend_from_slice(b"]}");
    out
}

/// The `Herald-Signature` value: `t=<unix seconds>,v1=<hex HMAC-SHA256 of
/// "<t>.<body>">`.
pub fn signature(secret: &[u8], unix_secs: u64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(unix_secs.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("t={unix_secs},v1={}", hex::encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_hmac_sha256_of_timestamp_dot_body() {
        // RFC 4231 style check against an independent computation:
        // HMAC-SHA256(key="key", "1.{}").
        let sig = signature(b"key", 1, b"{}");
        let mut mac = Hmac::<Sha256>::new_from_slice(b"key").unwrap();
        mac.update(b"1.{}");
        let want = hex::encode(mac.finalize().into_bytes());
        assert_eq!(sig, format!("t=1,v1={want}"));
        assert_ne!(signature(b"key", 2, b"{}"), sig, "the timestamp is signed");
        assert_ne!(signature(b"kez", 1, b"{}"), sig, "the key matters");
    }
}
