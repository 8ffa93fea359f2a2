//! Backend proxies: endpoints of the application's backend that Herald
//! asks synchronously before acting (docs/proxies.md). Only the `publish`
//! proxy exists so far: before a client's socket publish to an opted-in
//! namespace is appended, the backend allows it, refuses it (the refusal
//! reaches the client as `forbidden` with the backend's message) or
//! replaces its `data`. Fail closed: a timeout, a non-2xx answer or an
//! unreadable one refuses the publish as `unavailable` (503), and nothing
//! is appended.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use herald_proto::{ChannelName, ErrorCode};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;

use crate::error::ApiError;
use crate::State;

/// `[proxies]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxiesConfig {
    /// `[proxies.publish]`: asked before each client publish.
    pub publish: Option<ProxyConfig>,
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
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            timeout: Duration::from_secs(1),
            namespaces: Vec::new(),
            secret: String::new(),
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
        if self.secret.len() < crate::webhooks::config::MIN_SECRET_BYTES {
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

/// Ask the publish proxy, if `channel`'s namespace opted in: the `data` to
/// append (the client's or the backend's replacement), or the refusal.
pub async fn publish(
    state: &State,
    user: &str,
    device: Option<&str>,
    channel: &ChannelName,
    data: Box<RawValue>,
) -> Result<Box<RawValue>, ApiError> {
    let Some(p) = state.config.proxies.publish.as_ref().filter(|p| p.applies_to(channel)) else {
        return Ok(data);
    };
    let body = serde_json::to_vec(&PublishQuestion { channel: channel.as_str(), user, device, data: &data })
        .expect("questions serialise");
    let t = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let signature = crate::webhooks::sign::signature(p.secret.as_bytes(), t, &body);
    let unavailable = |why: &str| {
        tracing::warn!(channel = %channel, reason = why, "publish proxy failed; publish refused (fail closed)");
        ApiError::new(ErrorCode::Unavailable, "the publish proxy did not answer; nothing was published")
    };
    let resp = state
        .webhooks
        .http()
        .post(&p.url)
        .timeout(p.timeout)
        .header("content-type", "application/json")
        .header("herald-signature", signature)
        .body(body)
        .send()
        .await
        .map_err(|e| unavailable(if e.is_timeout() { "timeout" } else { "request failed" }))?;
    if !resp.status().is_success() {
        return Err(unavailable("non-2xx answer"));
    }
    let bytes = resp.bytes().await.map_err(|_| unavailable("body"))?;
    let answer: PublishAnswer =
        serde_json::from_slice(&bytes).map_err(|_| unavailable("unreadable answer"))?;
    if !answer.allow {
        let message: String = answer
            .message
            .unwrap_or_else(|| "refused by the publish proxy".into())
            .chars()
            .filter(|c| !c.is_control())
            .take(MESSAGE_MAX)
            .collect();
        return Err(ApiError::new(ErrorCode::Forbidden, message));
    }
    match answer.data {
        Some(replaced) if replaced.get().len() > state.config.limits.max_message_bytes => {
            Err(unavailable("replacement data above limits.max_message_bytes"))
        }
        Some(replaced) => Ok(replaced),
        None => Ok(data),
    }
}
