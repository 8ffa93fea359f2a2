//! Backend proxies: endpoints of the application's backend that Herald
//! asks synchronously before acting (docs/proxies.md):
//! - `publish`: before a client's socket publish to an opted-in namespace
//!   is appended, the backend allows it, refuses it (the refusal reaches
//!   the client as `forbidden` with the backend's message) or replaces its
//!   `data`;
//! - `subscribe`: before a client subscribes to a channel of an opted-in
//!   namespace (after the token's own check), the backend allows or
//!   refuses; an answer may be cached per (user, channel) for `cache`.
//!
//! - `connect`: before the upgrade of a connection that brings no token,
//!   the backend gets the chosen request headers (cookies) and answers the
//!   user, device, `channels`/`publish` patterns and an expiry, or a
//!   refusal that becomes the HTTP status (401 or 403) before the upgrade.
//!
//! Fail closed: a timeout, a non-2xx answer or an unreadable one refuses
//! the action as `unavailable` (503), and nothing is appended or
//! subscribed. Failures are never cached.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use herald_proto::{ChannelName, ErrorCode};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;

use crate::error::ApiError;
use crate::state::AppState;

/// `[proxies]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxiesConfig {
    /// `[proxies.publish]`: asked before each client publish.
    pub publish: Option<ProxyConfig>,
    /// `[proxies.subscribe]`: asked before each client subscription.
    pub subscribe: Option<ProxyConfig>,
    /// `[proxies.connect]`: asked before the upgrade of a connection that
    /// brings no token.
    pub connect: Option<ProxyConfig>,
}

/// One proxy endpoint.
#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyConfig {
    /// `http://` URL the question is POSTed to.
    pub url: String,
    /// Per request; past it the action is refused (fail closed).
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Namespaces whose channels ask the proxy (opt-in per namespace).
    pub namespaces: Vec<String>,
    /// HMAC-SHA256 key of `Herald-Signature` (as for webhooks), ≥ 32 bytes.
    #[serde(serialize_with = "redacted")]
    pub secret: String,
    /// `connect` only: request headers forwarded to the backend (lower
    /// case; default `cookie`).
    pub headers: Vec<String>,
    /// `subscribe` only: how long an answer (allow or refuse) is reused for
    /// the same user and channel on this node; `0s` = ask every time.
    #[serde(with = "humantime_serde")]
    pub cache: Duration,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            timeout: Duration::from_secs(1),
            namespaces: Vec::new(),
            secret: String::new(),
            cache: Duration::ZERO,
            headers: vec!["cookie".into()],
        }
    }
}

impl std::fmt::Debug for ProxyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyConfig")
            .field("url", &self.url)
            .field("timeout", &self.timeout)
            .field("namespaces", &self.namespaces)
            .finish_non_exhaustive()
    }
}

fn redacted<S: Serializer>(_: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str("<redacted>")
}

impl ProxiesConfig {
    pub fn validate(&self) -> Result<(), String> {
        if let Some(p) = &self.publish {
            p.validate("proxies.publish")?;
            if !p.cache.is_zero() {
                return Err("proxies.publish.cache: publish answers are never cached".into());
            }
        }
        if let Some(p) = &self.subscribe {
            p.validate("proxies.subscribe")?;
        }
        if let Some(p) = &self.connect {
            if p.url.is_empty() {
                return Err("proxies.connect.url is required".into());
            }
            let mut p = p.clone();
            // Connections have no namespace; the check below wants one.
            p.namespaces = vec!["-".into()];
            p.validate("proxies.connect")?;
            if !p.cache.is_zero() {
                return Err("proxies.connect.cache: connect answers are never cached".into());
            }
        }
        Ok(())
    }
}

impl ProxyConfig {
    fn validate(&self, key: &str) -> Result<(), String> {
        let url: http::Uri = self.url.parse().map_err(|e| format!("{key}.url: not a URL ({e})"))?;
        if url.scheme_str() != Some("http") || url.host().is_none() {
            return Err(format!("{key}.url must be an http:// URL with a host"));
        }
        if self.timeout.is_zero() {
            return Err(format!("{key}.timeout must be positive"));
        }
        if self.namespaces.is_empty() {
            return Err(format!("{key}.namespaces must name at least one namespace"));
        }
        if self.secret.len() < crate::integration::webhooks::config::MIN_SECRET_BYTES {
            return Err(format!("{key}.secret must be at least 32 bytes"));
        }
        Ok(())
    }

    fn applies_to(&self, channel: &ChannelName) -> bool {
        self.namespaces.iter().any(|n| n == channel.namespace())
    }
}

#[derive(Serialize)]
struct PublishQuestion<'a> {
    channel: &'a str,
    user: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    device: Option<&'a str>,
    data: &'a RawValue,
}

#[derive(Deserialize)]
struct PublishAnswer {
    allow: bool,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    data: Option<Box<RawValue>>,
}

/// Longest backend refusal message passed to the client.
const MESSAGE_MAX: usize = 200;

/// [`publish`] on a prepared client publish: the same publish with the
/// backend's `data`, or the refusal. Call it for each client publish after
/// the session's checks and before the engine (in frame order).
pub async fn check_publish(
    state: &AppState,
    user: &str,
    device: Option<&str>,
    mut p: crate::publish::Publish,
) -> Result<crate::publish::Publish, ApiError> {
    p.data = publish(state, user, device, &p.channel, p.data).await?;
    Ok(p)
}

/// Ask the publish proxy, if `channel`'s namespace opted in: the `data` to
/// append (the client's or the backend's replacement), or the refusal.
pub async fn publish(
    state: &AppState,
    user: &str,
    device: Option<&str>,
    channel: &ChannelName,
    data: Box<RawValue>,
) -> Result<Box<RawValue>, ApiError> {
    let Some(p) = state.config().proxies.publish.as_ref().filter(|p| p.applies_to(channel)) else {
        return Ok(data);
    };
    let body = serde_json::to_vec(&PublishQuestion { channel: channel.as_str(), user, device, data: &data })
        .expect("questions serialise");
    let bytes = ask(state, p, body, channel, "publish").await?;
    let answer: PublishAnswer = serde_json::from_slice(&bytes).map_err(|_| {
        count(state, "publish", "fail");
        unavailable(channel, "publish", "unreadable answer")
    })?;
    count(
        state,
        "publish",
        match (answer.allow, &answer.data) {
            (false, _) => "refuse",
            (true, Some(_)) => "replace",
            (true, None) => "allow",
        },
    );
    if !answer.allow {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            refusal(answer.message, "refused by the publish proxy"),
        ));
    }
    match answer.data {
        Some(replaced) if replaced.get().len() > state.config().websocket.max_message_bytes => {
            Err(unavailable(channel, "publish", "replacement data above websocket.max_message_bytes"))
        }
        Some(replaced) => Ok(replaced),
        None => Ok(data),
    }
}

#[derive(Serialize)]
struct SubscribeQuestion<'a> {
    channel: &'a str,
    user: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    device: Option<&'a str>,
}

#[derive(Deserialize)]
struct SubscribeAnswer {
    allow: bool,
    #[serde(default)]
    message: Option<String>,
}

type Answers = std::collections::HashMap<(String, ChannelName), (std::time::Instant, Result<(), String>)>;

/// Cached subscribe answers, per node.
#[derive(Default)]
pub struct SubscribeCache {
    answers: std::sync::Mutex<Answers>,
}

impl SubscribeCache {
    /// Forget every answer (a reload changed `[proxies]`).
    pub fn clear(&self) {
        self.answers.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// Cached answers kept before the cache is cleared.
const CACHE_CAP: usize = 100_000;

/// Ask the subscribe proxy, if `channel`'s namespace opted in.
pub async fn subscribe(
    state: &AppState,
    user: &str,
    device: Option<&str>,
    channel: &ChannelName,
) -> Result<(), ApiError> {
    let Some(p) = state.config().proxies.subscribe.as_ref().filter(|p| p.applies_to(channel)) else {
        return Ok(());
    };
    let cache = &state.subscribe_cache;
    let key = (user.to_owned(), channel.clone());
    if !p.cache.is_zero() {
        if let Some((at, answer)) = cache.answers.lock().expect("cache lock").get(&key) {
            if at.elapsed() < p.cache {
                count(state, "subscribe", "cached");
                return answer.clone().map_err(|m| ApiError::new(ErrorCode::Forbidden, m));
            }
        }
    }
    let body = serde_json::to_vec(&SubscribeQuestion { channel: channel.as_str(), user, device })
        .expect("questions serialise");
    let bytes = ask(state, p, body, channel, "subscribe").await?;
    let answer: SubscribeAnswer = serde_json::from_slice(&bytes).map_err(|_| {
        count(state, "subscribe", "fail");
        unavailable(channel, "subscribe", "unreadable answer")
    })?;
    count(state, "subscribe", if answer.allow { "allow" } else { "refuse" });
    let result =
        if answer.allow { Ok(()) } else { Err(refusal(answer.message, "refused by the subscribe proxy")) };
    if !p.cache.is_zero() {
        let mut answers = cache.answers.lock().expect("cache lock");
        if answers.len() >= CACHE_CAP {
            answers.clear();
        }
        answers.insert(key, (std::time::Instant::now(), result.clone()));
    }
    result.map_err(|m| ApiError::new(ErrorCode::Forbidden, m))
}

/// POST a signed question; the answer's body, or `unavailable`. Traced
/// as a child of what asks (a subscribe, a publish, a connect), with its
/// `traceparent` sent.
#[tracing::instrument(target = "herald::trace", level = "trace", name = "herald.proxy", skip_all, fields(proxy = which))]
async fn ask(
    state: &AppState,
    p: &ProxyConfig,
    body: Vec<u8>,
    channel: &ChannelName,
    which: &'static str,
) -> Result<bytes::Bytes, ApiError> {
    let t = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let signature = crate::integration::webhooks::sign::signature(p.secret.as_bytes(), t, &body);
    let started = std::time::Instant::now();
    let result = send(state, p, body, signature, channel, which).await;
    state.metrics.proxy_request_duration.observe(started.elapsed().as_secs_f64());
    if result.is_err() {
        count(state, which, "fail");
    }
    result
}

fn count(state: &AppState, which: &'static str, outcome: &'static str) {
    state.metrics.proxy_requests.get_or_create(&[("proxy", which), ("outcome", outcome)]).inc();
}

async fn send(
    state: &AppState,
    p: &ProxyConfig,
    body: Vec<u8>,
    signature: String,
    channel: &ChannelName,
    which: &'static str,
) -> Result<bytes::Bytes, ApiError> {
    let req = state
        .webhooks
        .http()
        .post(&p.url)
        .timeout(p.timeout)
        .header("content-type", "application/json")
        .header("herald-signature", signature);
    let req = match crate::trace::traceparent(&tracing::Span::current()) {
        Some(tp) => req.header("traceparent", tp),
        None => req,
    };
    let resp = req.body(body).send().await.map_err(|e| {
        unavailable(channel, which, if e.is_timeout() { "timeout" } else { "request failed" })
    })?;
    if !resp.status().is_success() {
        return Err(unavailable(channel, which, "non-2xx answer"));
    }
    resp.bytes().await.map_err(|_| unavailable(channel, which, "body"))
}

fn unavailable(channel: &ChannelName, which: &'static str, why: &str) -> ApiError {
    tracing::warn!(channel = %channel, proxy = which, reason = why, "proxy failed; action refused (fail closed)");
    ApiError::new(ErrorCode::Unavailable, format!("the {which} proxy did not answer; refused"))
}

/// The backend's refusal message, cleaned and bounded.
fn refusal(message: Option<String>, default: &str) -> String {
    message.unwrap_or_else(|| default.into()).chars().filter(|c| !c.is_control()).take(MESSAGE_MAX).collect()
}

#[derive(Deserialize)]
struct ConnectAnswer {
    allow: bool,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    device: Option<String>,
    #[serde(default)]
    channels: Vec<String>,
    #[serde(default)]
    publish: Vec<String>,
    /// Seconds the grant lasts; the connection is closed as with an expired
    /// token after it.
    #[serde(default)]
    expires_in: Option<u64>,
    #[serde(default)]
    status: Option<u16>,
    #[serde(default)]
    message: Option<String>,
}

/// Ask the connect proxy who a token-less connection is.
pub async fn connect(
    state: &AppState,
    p: &ProxyConfig,
    headers: &http::HeaderMap,
    device: Option<&str>,
) -> Result<crate::auth::Identity, ApiError> {
    let forwarded: serde_json::Map<String, serde_json::Value> = p
        .headers
        .iter()
        .filter_map(|h| {
            let v = headers.get(h.as_str())?.to_str().ok()?;
            Some((h.clone(), serde_json::Value::String(v.to_owned())))
        })
        .collect();
    let body = serde_json::to_vec(&serde_json::json!({ "headers": forwarded, "device": device }))
        .expect("questions serialise");
    let nowhere = ChannelName::new("connect:-").expect("a valid name");
    let bytes = ask(state, p, body, &nowhere, "connect").await?;
    let a: ConnectAnswer = serde_json::from_slice(&bytes).map_err(|_| {
        count(state, "connect", "fail");
        unavailable(&nowhere, "connect", "unreadable answer")
    })?;
    if !a.allow {
        count(state, "connect", "refuse");
        let code = if a.status == Some(403) { ErrorCode::Forbidden } else { ErrorCode::Unauthorized };
        return Err(ApiError::new(code, refusal(a.message, "refused by the connect proxy")));
    }
    let user = a.user.unwrap_or_default();
    let device = a.device.or(device.map(str::to_owned)).filter(|d| !d.is_empty());
    let valid = herald_proto::check_id(&user).is_ok()
        && !user.starts_with(crate::auth::RESERVED_USER_PREFIX)
        && device.as_deref().is_none_or(|d| herald_proto::check_id(d).is_ok());
    if !valid {
        count(state, "connect", "fail");
        return Err(unavailable(&nowhere, "connect", "invalid user or device in the answer"));
    }
    count(state, "connect", "allow");
    let exp =
        a.expires_in.map(|s| SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) + s);
    Ok(crate::auth::Identity::granted(&user, device.as_deref(), &a.channels, &a.publish, exp))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy() -> ProxyConfig {
        ProxyConfig {
            url: "http://127.0.0.1:9000/p".into(),
            namespaces: vec!["chat".into()],
            secret: "s".repeat(32),
            ..Default::default()
        }
    }

    #[test]
    fn proxy_settings_are_checked() {
        let ok = ProxiesConfig { publish: Some(proxy()), subscribe: Some(proxy()), connect: Some(proxy()) };
        assert_eq!(ok.validate(), Ok(()));
        let connect_without_namespaces = ProxiesConfig {
            connect: Some(ProxyConfig { namespaces: vec![], ..proxy() }),
            ..Default::default()
        };
        assert_eq!(connect_without_namespaces.validate(), Ok(()), "connections have no namespace");
        let bad: Vec<(ProxiesConfig, &str)> = vec![
            (
                ProxiesConfig {
                    publish: Some(ProxyConfig { secret: "short".into(), ..proxy() }),
                    ..Default::default()
                },
                "secret",
            ),
            (
                ProxiesConfig {
                    publish: Some(ProxyConfig { url: "https://x/".into(), ..proxy() }),
                    ..Default::default()
                },
                "url",
            ),
            (
                ProxiesConfig {
                    subscribe: Some(ProxyConfig { namespaces: vec![], ..proxy() }),
                    ..Default::default()
                },
                "namespaces",
            ),
            (
                ProxiesConfig {
                    publish: Some(ProxyConfig { cache: Duration::from_secs(1), ..proxy() }),
                    ..Default::default()
                },
                "cache",
            ),
            (
                ProxiesConfig {
                    connect: Some(ProxyConfig { timeout: Duration::ZERO, ..proxy() }),
                    ..Default::default()
                },
                "timeout",
            ),
        ];
        for (cfg, key) in bad {
            let err = cfg.validate().expect_err(key);
            assert!(err.contains(key), "{err} names {key}");
        }
    }

    #[test]
    fn refusal_messages_are_cleaned_and_bounded() {
        assert_eq!(refusal(Some("no\nway\u{7}".into()), "d"), "noway");
        assert_eq!(refusal(None, "default"), "default");
        assert_eq!(refusal(Some("x".repeat(500)), "d").len(), MESSAGE_MAX);
    }
}
