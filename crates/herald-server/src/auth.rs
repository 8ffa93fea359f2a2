//! Authentication: JWTs for WebSocket clients, API keys for the HTTP API.
//!
//! Tokens and keys are never logged; errors name the failed check only.
//! Token verification and its keys are in `jwt.rs` (static keys, chosen by
//! `kid`) and `jwks.rs` (the keys of an identity provider's JWKS endpoint).

mod jwks;
mod jwt;

pub use jwks::{check_jwks_url, Jwks};
pub use jwt::JwtVerifier;

/// The verifier `cfg` asks for, its JWKS kept from `current` when that
/// fetches the same endpoint with the same bounds, else started (inside
/// the runtime). Used at start and by a reload.
pub fn verifier(
    cfg: &crate::config::JwtConfig,
    current: Option<&JwtVerifier>,
    metrics: &Arc<crate::metrics::Metrics>,
) -> Result<JwtVerifier, String> {
    let verifier = JwtVerifier::new(cfg)?;
    if cfg.jwks_url.is_none() {
        metrics.jwks_keys.set(0);
        return Ok(verifier);
    }
    let jwks = match current.and_then(JwtVerifier::jwks) {
        Some(j) if j.serves(cfg) => j.clone(),
        _ => Jwks::start(cfg, metrics.clone()).map_err(|e| format!("jwks_url: {e}"))?,
    };
    Ok(verifier.with_jwks(jwks))
}

use std::sync::Arc;

use herald_core::NamespaceOptions;
use herald_proto::{check_id, ChannelName, ErrorCode};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The prefix of reserved user ids: the server's own subscribers (a
/// webhook's cursor is `herald:webhook:NAME`), never a client's user id.
pub const RESERVED_USER_PREFIX: &str = "herald:";

/// The credential of an `Authorization: Bearer <credential>` header.
pub fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
}

/// Who a WebSocket connection is, and what it may do.
#[derive(Debug, Clone)]
pub struct Identity {
    pub sub: Arc<str>,
    pub device: Option<Arc<str>>,
    subscribe: Vec<Pattern>,
    publish: Vec<Pattern>,
    /// The entries of the `channels` claim (or the connect proxy's answer)
    /// that are channel names, in order: server-side subscriptions on the
    /// Centrifugo endpoint (docs/centrifugo.md). Patterns (`chat:*`) are
    /// permissions only.
    pub server_side: Vec<ChannelName>,
    /// Token expiry (seconds since the Unix epoch); `None` in dev mode.
    pub exp: Option<u64>,
    /// When the token was issued (its `iat`, seconds since the Unix
    /// epoch; 0 for a token without one, which any revocation covers);
    /// `None` without a token (dev mode, the connect proxy).
    pub iat: Option<u64>,
    /// The token's `info` claim (JSON text): what presence members see about
    /// this client. Wins over the subscribe frame's `info`.
    pub info: Option<Box<str>>,
}

impl Identity {
    /// A dev-mode identity: may subscribe and publish everywhere.
    pub fn dev(user: &str, device: Option<&str>) -> Self {
        Self {
            sub: Arc::from(user),
            device: device.map(Arc::from),
            subscribe: vec![Pattern::All],
            publish: vec![Pattern::All],
            server_side: Vec::new(),
            exp: None,
            iat: None,
            info: None,
        }
    }

    /// An identity granted by the connect proxy (`proxies.rs`): channel
    /// patterns as in tokens.
    pub fn granted(
        sub: &str,
        device: Option<&str>,
        channels: &[String],
        publish: &[String],
        exp: Option<u64>,
    ) -> Self {
        Self {
            sub: Arc::from(sub),
            device: device.map(Arc::from),
            subscribe: channels.iter().map(|p| Pattern::parse(p)).collect(),
            publish: publish.iter().map(|p| Pattern::parse(p)).collect(),
            server_side: server_side(channels),
            exp,
            iat: None,
            info: None,
        }
    }

    /// `user:{sub}` is always allowed for its own sub.
    fn is_own_user_channel(&self, channel: &ChannelName) -> bool {
        channel.namespace() == "user" && channel.local_part() == &*self.sub
    }

    /// Whether this client may subscribe to `channel` (of namespace `ns`)
    /// and read it: a user-limited channel of a namespace that allows them
    /// is its listed users' only, else the token's patterns decide (and a
    /// user's own `user:{sub}`).
    pub fn may_subscribe(&self, channel: &ChannelName, ns: &NamespaceOptions) -> bool {
        if ns.allow_user_limited {
            if let Some(mut users) = channel.limited_users() {
                return users.any(|u| u == &*self.sub);
            }
        }
        self.is_own_user_channel(channel) || self.subscribe.iter().any(|p| p.matches(channel.as_str()))
    }

    pub fn may_publish(&self, channel: &ChannelName) -> bool {
        self.publish.iter().any(|p| p.matches(channel.as_str()))
    }
}

/// The entries of a `channels` list that are channel names (no `*`).
fn server_side(channels: &[String]) -> Vec<ChannelName> {
    let mut out: Vec<ChannelName> = Vec::new();
    for c in channels {
        if let Ok(name) = ChannelName::new(c) {
            if !out.contains(&name) {
                out.push(name);
            }
        }
    }
    out
}

/// A channel pattern from a token: exact, or a prefix ending in `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    All,
    Exact(String),
    Prefix(String),
}

impl Pattern {
    fn parse(s: &str) -> Self {
        match s.strip_suffix('*') {
            Some("") => Pattern::All,
            Some(prefix) => Pattern::Prefix(prefix.to_owned()),
            None => Pattern::Exact(s.to_owned()),
        }
    }

    fn matches(&self, channel: &str) -> bool {
        match self {
            Pattern::All => true,
            Pattern::Exact(s) => s == channel,
            Pattern::Prefix(p) => channel.starts_with(p.as_str()),
        }
    }
}

#[derive(Debug, Deserialize)]
struct Claims {
    sub: String,
    #[serde(default)]
    channels: Vec<String>,
    #[serde(default)]
    publish: Vec<String>,
    /// Centrifugo's capabilities: permissions without server-side
    /// subscriptions.
    #[serde(default)]
    caps: Vec<Cap>,
    #[serde(default)]
    device: Option<String>,
    #[serde(default)]
    info: Option<serde_json::Value>,
    exp: u64,
    /// Issued at (seconds); checked against revocations.
    #[serde(default)]
    iat: Option<u64>,
}

/// One entry of Centrifugo's `caps` claim: what the client may do on
/// `channels`. `sub` grants subscribe (and with it history and presence,
/// which Herald checks as subscribe), `pub` publish; `hst` and `prs` alone
/// grant nothing more. `match`: absent (exact names) or `wildcard` (a
/// trailing `*`, as in `channels`); `regex` is refused.
#[derive(Debug, Deserialize)]
struct Cap {
    #[serde(default)]
    channels: Vec<String>,
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default, rename = "match")]
    match_type: String,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{message}")]
pub struct AuthError {
    pub code: ErrorCode,
    pub message: &'static str,
}

impl AuthError {
    pub(crate) const fn new(code: ErrorCode, message: &'static str) -> Self {
        Self { code, message }
    }
}

/// The identity of a token whose signature and registered claims
/// (`exp`, `nbf`, `iss`, `aud`) were checked (`jwt.rs`): its own claims
/// checked and turned into permissions.
fn identity_from(c: Claims, device_param: Option<&str>) -> Result<Identity, AuthError> {
    // Ids by the one rule of `herald_proto::check_id` (SubscriberId's).
    if check_id(&c.sub).is_err() {
        return Err(AuthError::new(
            ErrorCode::Unauthorized,
            "token `sub` must be 1..=255 bytes without control characters",
        ));
    }
    // Reserved for Herald's own subscribers (webhooks ack as
    // `herald:webhook:<name>`): no client may ack in their name.
    if c.sub.starts_with(RESERVED_USER_PREFIX) {
        return Err(AuthError::new(
            ErrorCode::Unauthorized,
            "token `sub` must not start with `herald:` (reserved)",
        ));
    }
    if c.device.as_deref().is_some_and(|d| check_id(d).is_err()) {
        return Err(AuthError::new(
            ErrorCode::Unauthorized,
            "token `device` must be 1..=255 bytes without control characters",
        ));
    }
    // A device claim in the token wins over the query parameter.
    let device = c.device.as_deref().or(device_param).map(Arc::from);
    let info = c.info.map(|v| v.to_string().into_boxed_str());
    if info.as_ref().is_some_and(|i| i.len() > herald_proto::MAX_MEMBER_INFO_LEN) {
        return Err(AuthError::new(ErrorCode::Unauthorized, "the token's `info` claim is too long"));
    }
    let mut subscribe: Vec<Pattern> = c.channels.iter().map(|p| Pattern::parse(p)).collect();
    let mut publish: Vec<Pattern> = c.publish.iter().map(|p| Pattern::parse(p)).collect();
    for cap in &c.caps {
        if !matches!(cap.match_type.as_str(), "" | "wildcard") {
            return Err(AuthError::new(
                ErrorCode::Unauthorized,
                "token `caps`: only exact and `wildcard` (a trailing `*`) matches are supported",
            ));
        }
        let patterns = || cap.channels.iter().map(|p| Pattern::parse(p));
        if cap.allow.iter().any(|a| a == "sub") {
            subscribe.extend(patterns());
        }
        if cap.allow.iter().any(|a| a == "pub") {
            publish.extend(patterns());
        }
    }
    Ok(Identity {
        sub: Arc::from(c.sub),
        device,
        subscribe,
        publish,
        server_side: server_side(&c.channels),
        exp: Some(c.exp),
        iat: Some(c.iat.unwrap_or(0)),
        info,
    })
}

/// The API credentials. Each key is identified by a short hash of itself, which
/// scopes its idempotency keys; the key itself is never stored elsewhere.
pub struct ApiKeys {
    digests: Vec<[u8; 32]>,
}

impl ApiKeys {
    pub fn new(keys: &[String]) -> Self {
        Self { digests: keys.iter().map(|k| Sha256::digest(k.as_bytes()).into()).collect() }
    }

    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// Check a bearer key; returns its scope id.
    pub fn check(&self, key: &str) -> Option<String> {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        self.digests.iter().find(|d| **d == digest).map(|d| hex::encode(&d[..8]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_exact_prefix_and_all() {
        assert!(Pattern::parse("chat:*").matches("chat:1"));
        assert!(!Pattern::parse("chat:*").matches("chatx:1"));
        assert!(Pattern::parse("chat:1").matches("chat:1"));
        assert!(!Pattern::parse("chat:1").matches("chat:10"));
        assert!(Pattern::parse("*").matches("anything"));
    }

    #[test]
    fn own_user_channel_is_always_allowed() {
        let id = Identity {
            sub: "42".into(),
            device: None,
            subscribe: vec![],
            publish: vec![],
            server_side: vec![],
            exp: None,
            iat: None,
            info: None,
        };
        let ns = NamespaceOptions::default();
        assert!(id.may_subscribe(&ChannelName::new("user:42").unwrap(), &ns));
        assert!(!id.may_subscribe(&ChannelName::new("user:43").unwrap(), &ns));
        assert!(!id.may_subscribe(&ChannelName::new("user:420").unwrap(), &ns));
        assert!(!id.may_publish(&ChannelName::new("user:42").unwrap()));
    }

    #[test]
    fn user_limited_channels_are_their_users_only() {
        let id = Identity::dev("42", None);
        let limited = NamespaceOptions { allow_user_limited: true, ..Default::default() };
        let plain = NamespaceOptions::default();
        let listed = ChannelName::new("dm:chat#41,42").unwrap();
        let unlisted = ChannelName::new("dm:chat#41,43").unwrap();
        assert!(id.may_subscribe(&listed, &limited));
        // Listed or not decides, whatever the token allows (dev: all).
        assert!(!id.may_subscribe(&unlisted, &limited));
        // Without the option the name is an ordinary one: the token decides.
        assert!(id.may_subscribe(&unlisted, &plain));
        let no_grants = Identity::granted("42", None, &[], &[], None);
        assert!(no_grants.may_subscribe(&listed, &limited), "no token permission needed");
        assert!(!no_grants.may_subscribe(&listed, &plain));
    }

    #[test]
    fn api_keys_scope_by_digest() {
        let keys = ApiKeys::new(&["0123456789abcdef".into(), "fedcba9876543210".into()]);
        let a = keys.check("0123456789abcdef").unwrap();
        let b = keys.check("fedcba9876543210").unwrap();
        assert_ne!(a, b);
        assert_eq!(keys.check("nope"), None);
    }
}
