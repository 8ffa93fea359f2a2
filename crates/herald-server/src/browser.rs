//! What browsers get: the `Origin` check of `/ws`, CORS for `/api/v1`, and
//! the response headers every answer carries.
//!
//! A browser sends a page's ambient credentials (cookies, HTTP auth, client
//! certificates) with a WebSocket handshake whatever site the page is on, and
//! WebSockets are not subject to CORS, so the server itself must refuse
//! handshakes from pages on other sites (`allowed_origins`). The HTTP API
//! takes bearer keys only, so CORS there is about which pages may call it at
//! all (`cors_origins`, default none).

use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method};
use herald_proto::ErrorCode;
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::error::ApiError;

/// A list of origins from the configuration: exact `scheme://host[:port]`
/// origins, or `*` for any.
#[derive(Debug, Clone, Default)]
pub struct Origins {
    any: bool,
    /// Lowercase, without a default port.
    exact: Vec<String>,
}

impl Origins {
    /// Parse and normalise; the error names the bad entry.
    pub fn parse(list: &[String]) -> Result<Origins, String> {
        let mut out = Origins::default();
        for entry in list {
            let e = entry.trim();
            if e == "*" {
                out.any = true;
                continue;
            }
            let normal = normalise_origin(e).ok_or_else(|| {
                format!("`{entry}` is not `*` or an origin like `https://app.example.com` (scheme, host, optional port; no path)")
            })?;
            out.exact.push(normal);
        }
        Ok(out)
    }

    pub fn is_empty(&self) -> bool {
        !self.any && self.exact.is_empty()
    }

    fn allows(&self, origin: &str) -> bool {
        self.any || normalise_origin(origin).is_some_and(|o| self.exact.contains(&o))
    }
}

/// `scheme://host[:port]` lowercased, with the scheme's default port
/// removed; `None` for anything else (a path, `null`, other schemes).
fn normalise_origin(origin: &str) -> Option<String> {
    let (scheme, authority) = origin.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => ":80",
        "https" => ":443",
        _ => return None,
    };
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']');
    if authority.is_empty() || !authority.chars().all(valid) {
        return None;
    }
    let authority = authority.to_ascii_lowercase();
    let authority = authority.strip_suffix(default_port).unwrap_or(&authority);
    Some(format!("{scheme}://{authority}"))
}

/// Whether `origin` names the host the request was sent to (its `Host`
/// header): the server's own pages, such as the console.
fn same_host(origin: &str, host: Option<&HeaderValue>) -> bool {
    let (Some(origin), Some(host)) = (normalise_origin(origin), host.and_then(|h| h.to_str().ok())) else {
        return false;
    };
    let Some((scheme, authority)) = origin.split_once("://") else { return false };
    let default_port = if scheme == "https" { ":443" } else { ":80" };
    let host = host.trim().to_ascii_lowercase();
    let host = host.strip_suffix(default_port).unwrap_or(&host);
    authority == host
}

/// The `Origin` check of a WebSocket handshake, before the 101. Requests
/// without an `Origin` are not from a browser page and pass; dev mode lets
/// every origin through.
pub(crate) fn check_ws_origin(dev: bool, allowed: &Origins, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(origin) = headers.get(header::ORIGIN) else { return Ok(()) };
    if dev {
        return Ok(());
    }
    let origin = origin.to_str().unwrap_or("");
    if allowed.allows(origin) || same_host(origin, headers.get(header::HOST)) {
        return Ok(());
    }
    Err(ApiError::new(
        ErrorCode::OriginNotAllowed,
        "pages on this origin may not connect: add it to `allowed_origins`",
    ))
}

/// The request headers the API reads.
const ALLOWED_HEADERS: [HeaderName; 4] = [
    header::AUTHORIZATION,
    header::CONTENT_TYPE,
    HeaderName::from_static("idempotency-key"),
    header::IF_MATCH,
];

/// The response headers a page may read besides the CORS-safelisted ones.
const EXPOSED_HEADERS: [HeaderName; 3] =
    [header::ETAG, HeaderName::from_static("idempotent-replayed"), header::RETRY_AFTER];

/// CORS for `/api/v1`, or `None` when no origin is configured (no CORS
/// headers at all). Preflights are answered by the layer; credentials are not
/// allowed (the API takes an `Authorization` header that the page sets, never
/// cookies).
pub(crate) fn cors_layer(origins: &Origins) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow_origin = if origins.any {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(
            origins
                .exact
                .iter()
                .map(|o| HeaderValue::from_str(o).expect("a normalised origin is a header value")),
        )
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow_origin)
            .allow_methods([Method::GET, Method::POST, Method::PUT, Method::PATCH, Method::DELETE])
            .allow_headers(ALLOWED_HEADERS)
            .expose_headers(EXPOSED_HEADERS)
            .max_age(Duration::from_secs(600)),
    )
}

/// Every answer: never content-sniffed by a browser.
pub(crate) const NOSNIFF: HeaderValue = HeaderValue::from_static("nosniff");
/// API answers hold live or private data: never stored by a cache (the
/// console's files set their own `no-cache`).
pub(crate) const NO_STORE: HeaderValue = HeaderValue::from_static("no-store");

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(origin: &str, host: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ORIGIN, HeaderValue::from_str(origin).unwrap());
        h.insert(header::HOST, HeaderValue::from_str(host).unwrap());
        h
    }

    #[test]
    fn origins_parse_and_normalise() {
        let o =
            Origins::parse(&["https://App.Example.com:443".into(), "http://localhost:3000".into()]).unwrap();
        assert_eq!(o.exact, ["https://app.example.com", "http://localhost:3000"]);
        assert!(o.allows("https://app.example.com") && !o.allows("https://app.example.com:8443"));
        for bad in ["app.example.com", "https://a.example/path", "null", "ftp://x", "https://"] {
            assert!(Origins::parse(&[bad.into()]).is_err(), "{bad}");
        }
        assert!(Origins::parse(&["*".into()]).unwrap().allows("null"));
        assert!(Origins::parse(&[]).unwrap().is_empty());
    }

    #[test]
    fn ws_origin_is_checked_against_the_host_and_the_list() {
        let none = Origins::default();
        assert!(check_ws_origin(false, &none, &headers("http://127.0.0.1:8700", "127.0.0.1:8700")).is_ok());
        assert!(
            check_ws_origin(false, &none, &headers("https://herald.example", "herald.example:443")).is_ok()
        );
        let e =
            check_ws_origin(false, &none, &headers("https://evil.example", "herald.example")).unwrap_err();
        assert_eq!(e.code, ErrorCode::OriginNotAllowed);
        assert!(check_ws_origin(false, &none, &headers("http://127.0.0.1:8701", "127.0.0.1:8700")).is_err());
        assert!(check_ws_origin(false, &none, &headers("null", "herald.example")).is_err());
        assert!(check_ws_origin(true, &none, &headers("https://evil.example", "herald.example")).is_ok());
        assert!(check_ws_origin(false, &none, &HeaderMap::new()).is_ok(), "no Origin: not a browser");
        let listed = Origins::parse(&["https://app.example".into()]).unwrap();
        assert!(check_ws_origin(false, &listed, &headers("https://app.example", "herald.example")).is_ok());
        assert!(check_ws_origin(false, &listed, &headers("https://evil.example", "herald.example")).is_err());
    }
}
