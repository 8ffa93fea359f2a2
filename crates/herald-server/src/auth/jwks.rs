//! [`Jwks`]: the keys an identity provider publishes at its JWKS endpoint
//! (`jwt.jwks_url`), fetched, cached and refreshed.
//!
//! One task per [`Jwks`] fetches at once, then again when the answer's
//! `Cache-Control: max-age` runs out, held between `jwt.jwks_refresh_min`
//! and `jwt.jwks_refresh_max` (without one: the max). A token whose `kid`
//! no key has asks for a fetch sooner ([`Jwks::refresh_for_unknown_key`]),
//! at most once per `jwks_refresh_min`. A failed fetch (unreachable, not
//! 2xx, not a JWKS, no usable key) keeps the keys held, is logged and
//! counted, and is tried again after `jwks_refresh_min`. Fetches are
//! serialised, so concurrent unknown `kid`s share one.
//!
//! Only public keys are taken from a JWKS: RSA (RS256), EC P-256 (ES256)
//! and OKP Ed25519 (EdDSA); symmetric (`oct`) keys, keys for encryption
//! (`use: enc`) and other algorithms are skipped. The endpoint is reached
//! over HTTPS with the Mozilla roots (webpki-roots); plain HTTP only to a
//! loopback address ([`check_jwks_url`]). Key material is never logged.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::Uri;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use tokio_util::sync::CancellationToken;

use super::jwt::Key;
use crate::config::JwtConfig;
use crate::metrics::Metrics;

/// Longest a fetch may take, connect to last byte.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest JWKS document read.
const MAX_JWKS_BYTES: usize = 1024 * 1024;

/// Why `url` is not a JWKS endpoint Herald will fetch: not an absolute
/// `https://` URL, or `http://` to a host that is not a loopback address.
pub fn check_jwks_url(url: &str) -> Result<Uri, String> {
    let uri: Uri = url.parse().map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    let host = uri.host().ok_or_else(|| format!("`{url}` has no host"))?;
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err("must not hold credentials".into());
    }
    match uri.scheme_str() {
        Some("https") => Ok(uri),
        Some("http") if is_loopback(host) => Ok(uri),
        Some("http") => Err(format!(
            "plain http is allowed only to a loopback address (127.0.0.1, ::1, localhost), not `{host}`: use https"
        )),
        _ => Err(format!("`{url}` must start with https://")),
    }
}

fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost") || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// The keys of one JWKS endpoint (see the module docs). Dropping it stops
/// its task.
pub struct Jwks {
    inner: Arc<Inner>,
    stop: CancellationToken,
}

struct Inner {
    url: Uri,
    /// `url` without its path and query, for logs.
    origin: String,
    refresh_min: Duration,
    refresh_max: Duration,
    client: HttpsClient,
    keys: ArcSwap<Vec<Key>>,
    /// When the last fetch started; its lock serialises fetches.
    last_fetch: tokio::sync::Mutex<Option<Instant>>,
    metrics: Arc<Metrics>,
}

impl Jwks {
    /// Start fetching `cfg.jwks_url` (checked by `JwtVerifier::new`); must
    /// run inside the tokio runtime.
    pub fn start(cfg: &JwtConfig, metrics: Arc<Metrics>) -> Result<Arc<Self>, String> {
        let url = check_jwks_url(cfg.jwks_url.as_deref().unwrap_or_default())?;
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
            .map_err(|e| format!("TLS: {e}"))?
            .https_or_http()
            .enable_http1()
            .build();
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build(https);
        let origin = format!(
            "{}://{}",
            url.scheme_str().unwrap_or("https"),
            url.authority().map_or("", |a| a.as_str())
        );
        let inner = Arc::new(Inner {
            url,
            origin,
            refresh_min: cfg.jwks_refresh_min,
            refresh_max: cfg.jwks_refresh_max,
            client,
            keys: ArcSwap::from_pointee(Vec::new()),
            last_fetch: tokio::sync::Mutex::new(None),
            metrics,
        });
        let stop = CancellationToken::new();
        tokio::spawn(run(inner.clone(), stop.clone()));
        Ok(Arc::new(Self { inner, stop }))
    }

    /// Whether this is the JWKS `cfg` asks for (same endpoint and bounds).
    pub fn serves(&self, cfg: &JwtConfig) -> bool {
        cfg.jwks_url.as_deref().and_then(|u| u.parse::<Uri>().ok()).as_ref() == Some(&self.inner.url)
            && cfg.jwks_refresh_min == self.inner.refresh_min
            && cfg.jwks_refresh_max == self.inner.refresh_max
    }

    /// The keys held now.
    pub(crate) fn keys(&self) -> Arc<Vec<Key>> {
        self.inner.keys.load_full()
    }

    /// A token's key is not among `seen` (the keys it was checked with):
    /// fetch now unless a fetch started less than `jwks_refresh_min` ago.
    /// Whether the keys held differ from `seen` afterwards (this fetch or
    /// one that ran meanwhile swapped them in).
    pub(crate) async fn refresh_for_unknown_key(&self, seen: &Arc<Vec<Key>>) -> bool {
        let mut last = self.inner.last_fetch.lock().await;
        if !Arc::ptr_eq(&self.inner.keys.load(), seen) {
            return true;
        }
        if last.is_some_and(|at| at.elapsed() < self.inner.refresh_min) {
            return false;
        }
        self.inner.fetch(&mut last, "unknown kid").await;
        !Arc::ptr_eq(&self.inner.keys.load(), seen)
    }
}

impl Drop for Jwks {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Fetch, then again whenever the keys are due, until `stop`.
async fn run(inner: Arc<Inner>, stop: CancellationToken) {
    loop {
        let wait = {
            let mut last = tokio::select! {
                l = inner.last_fetch.lock() => l,
                () = stop.cancelled() => return,
            };
            inner.fetch(&mut last, "schedule").await
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stop.cancelled() => return,
        }
    }
}

impl Inner {
    /// One fetch (the caller holds `last_fetch`): the keys swapped in on
    /// success, kept on failure. When the next scheduled fetch is due.
    async fn fetch(&self, last: &mut Option<Instant>, why: &'static str) -> Duration {
        *last = Some(Instant::now());
        match tokio::time::timeout(FETCH_TIMEOUT, self.get())
            .await
            .unwrap_or_else(|_| Err("timed out".into()))
        {
            Ok((keys, max_age)) => {
                let n = keys.len();
                self.keys.store(Arc::new(keys));
                self.metrics.jwks_keys.set(n as i64);
                self.metrics.jwks_refreshes.get_or_create(&[("result", "ok")]).inc();
                tracing::debug!(jwks = %self.origin, keys = n, why, "JWKS fetched");
                max_age.unwrap_or(self.refresh_max).clamp(self.refresh_min, self.refresh_max)
            }
            Err(e) => {
                self.metrics.jwks_refreshes.get_or_create(&[("result", "failed")]).inc();
                tracing::warn!(
                    jwks = %self.origin,
                    error = %e,
                    keys_kept = self.keys.load().len(),
                    "JWKS fetch failed: the keys held are kept"
                );
                self.refresh_min
            }
        }
    }

    /// GET the JWKS: its usable keys and the answer's max-age.
    async fn get(&self) -> Result<(Vec<Key>, Option<Duration>), String> {
        let req = http::Request::get(self.url.clone())
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::USER_AGENT, concat!("herald/", env!("CARGO_PKG_VERSION")))
            .body(Empty::new())
            .map_err(|e| e.to_string())?;
        let resp = self.client.request(req).await.map_err(|e| format!("request: {e}"))?;
        if !resp.status().is_success() {
            return Err(format!("status {}", resp.status()));
        }
        let max_age =
            resp.headers().get(http::header::CACHE_CONTROL).and_then(|v| v.to_str().ok()).and_then(max_age);
        let body = Limited::new(resp.into_body(), MAX_JWKS_BYTES)
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        let keys = parse(&body)?;
        if keys.is_empty() {
            return Err("no usable key (RSA, EC P-256, Ed25519 for signatures)".into());
        }
        Ok((keys, max_age))
    }
}

/// The `max-age` of a `Cache-Control` value; `no-store` and `no-cache`
/// count as 0.
fn max_age(value: &str) -> Option<Duration> {
    value.split(',').map(str::trim).find_map(|d| {
        let lower = d.to_ascii_lowercase();
        match lower.as_str() {
            "no-store" | "no-cache" => Some(Duration::ZERO),
            _ => lower
                .strip_prefix("max-age=")
                .and_then(|n| n.trim_matches('"').parse().ok())
                .map(Duration::from_secs),
        }
    })
}

/// The usable keys of a JWKS document; an entry that does not read as a
/// key, or is not one Herald takes, is skipped.
pub(crate) fn parse(body: &[u8]) -> Result<Vec<Key>, String> {
    #[derive(serde::Deserialize)]
    struct Set {
        keys: Vec<serde_json::Value>,
    }
    let set: Set = serde_json::from_slice(body).map_err(|e| format!("not a JWKS: {e}"))?;
    Ok(set
        .keys
        .into_iter()
        .filter_map(|v| serde_json::from_value::<Jwk>(v).ok())
        .filter_map(|j| key_of(&j))
        .collect())
}

/// A verification key from a JWK of a kind Herald takes (module docs).
fn key_of(jwk: &Jwk) -> Option<Key> {
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return None;
    }
    let named = jwk.common.key_algorithm;
    let alg = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) if matches!(named, None | Some(KeyAlgorithm::RS256)) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(p)
            if p.curve == EllipticCurve::P256 && matches!(named, None | Some(KeyAlgorithm::ES256)) =>
        {
            Algorithm::ES256
        }
        AlgorithmParameters::OctetKeyPair(p)
            if p.curve == EllipticCurve::Ed25519 && matches!(named, None | Some(KeyAlgorithm::EdDSA)) =>
        {
            Algorithm::EdDSA
        }
        _ => return None,
    };
    let key = DecodingKey::from_jwk(jwk).ok()?;
    Some(Key { kid: jwk.common.key_id.clone(), alg, key })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwks_urls_are_https_or_loopback_http() {
        assert!(check_jwks_url("https://idp.example.com/.well-known/jwks.json").is_ok());
        assert!(check_jwks_url("http://127.0.0.1:8080/jwks").is_ok());
        assert!(check_jwks_url("http://[::1]:8080/jwks").is_ok());
        assert!(check_jwks_url("http://localhost/jwks").is_ok());
        let e = check_jwks_url("http://idp.example.com/jwks").unwrap_err();
        assert!(e.contains("loopback") && e.contains("idp.example.com"), "{e}");
        assert!(check_jwks_url("ftp://idp.example.com/jwks").is_err());
        assert!(check_jwks_url("https://user:pw@idp.example.com/jwks").is_err());
        assert!(check_jwks_url("/jwks").is_err());
    }

    #[test]
    fn max_age_reads_cache_control() {
        assert_eq!(max_age("public, max-age=300"), Some(Duration::from_secs(300)));
        assert_eq!(max_age("no-store"), Some(Duration::ZERO));
        assert_eq!(max_age("public"), None);
    }

    #[test]
    fn only_signature_public_keys_are_taken() {
        let doc = serde_json::json!({ "keys": [
            { "kty": "oct", "k": "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0", "kid": "sym" },
            { "kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo", "kid": "ed" },
            { "kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo", "use": "enc" },
            { "kty": "EC", "crv": "P-256", "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
              "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0", "kid": "ec" },
            { "kty": "RSA", "alg": "RS384", "n": "AQAB", "e": "AQAB", "kid": "rs384" },
            { "kty": "weird" }
        ]});
        let keys = parse(doc.to_string().as_bytes()).unwrap();
        let kids: Vec<_> = keys.iter().map(|k| (k.kid.as_deref().unwrap(), k.alg)).collect();
        assert_eq!(kids, [("ed", Algorithm::EdDSA), ("ec", Algorithm::ES256)]);
        assert!(parse(b"{}").is_err());
    }
}
