//! Connection tokens signed with [`JWT_SECRET`](crate::JWT_SECRET), the
//! harness servers' HS256 key.

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

use crate::JWT_SECRET;

/// Seconds since the Unix epoch.
pub fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `claims` signed with HS256 and [`JWT_SECRET`](crate::JWT_SECRET).
pub fn hs256_token(claims: &Value) -> String {
    encode(&Header::new(Algorithm::HS256), claims, &EncodingKey::from_secret(JWT_SECRET.as_bytes()))
        .expect("claims sign")
}

/// A token for `sub` with the `channels` claim, expiring in `exp_in` seconds.
pub fn user_token(sub: &str, channels: &[&str], exp_in: u64) -> String {
    hs256_token(&json!({ "sub": sub, "channels": channels, "exp": now_secs() + exp_in }))
}
