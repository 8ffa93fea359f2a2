//! Turning the user's server address into what the handshake needs.

use http::Uri;

use crate::ClientError;

/// Where and what to request for the WebSocket upgrade.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WsTarget {
    /// Host for the TCP connect (IPv6 without brackets).
    pub host: String,
    pub port: u16,
    /// Value of the `Host` header (IPv6 with brackets, port when given).
    pub host_header: String,
    /// Request target: path plus query.
    pub path_and_query: String,
}

/// A parsed `http://host:port[/prefix]` (or `ws://`) base address.
#[derive(Debug, Clone)]
pub(crate) struct BaseUrl {
    host: String,
    port: u16,
    host_header: String,
    path: String,
    query: Option<String>,
}

impl BaseUrl {
    /// Accepts `http://`, `ws://` or no scheme. TLS schemes are refused: this
    /// client has no TLS (Herald is expected behind a TLS-terminating proxy
    /// when exposed).
    pub fn parse(url: &str) -> Result<Self, ClientError> {
        let bad = |reason: &str| ClientError::Config(format!("server URL `{url}`: {reason}"));
        let uri: Uri = url.parse().map_err(|e| bad(&format!("{e}")))?;
        match uri.scheme_str() {
            None | Some("http") | Some("ws") => {}
            Some("https") | Some("wss") => return Err(bad("TLS is not supported by this client")),
            Some(other) => return Err(bad(&format!("unsupported scheme `{other}`"))),
        }
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        let host_header = match authority.as_str().rsplit_once('@') {
            Some((_userinfo, rest)) => rest.to_owned(),
            None => authority.as_str().to_owned(),
        };
        let host = authority.host().trim_start_matches('[').trim_end_matches(']').to_owned();
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let port = authority.port_u16().unwrap_or(80);
        // `Uri` reports "/" for an empty path; keep the prefix without its
        // trailing slash so joining is uniform.
        let path = uri.path().trim_end_matches('/').to_owned();
        Ok(Self { host, port, host_header, path, query: uri.query().map(str::to_owned) })
    }

    /// The upgrade target: the path gets `/ws` appended unless it already
    /// ends with it; `params` are appended to any query the URL had.
    pub fn ws_target(&self, params: &[(&str, &str)]) -> WsTarget {
        let mut path = self.path.clone();
        if !path.ends_with("/ws") {
            path.push_str("/ws");
        }
        let mut query = self.query.clone().unwrap_or_default();
        for (k, v) in params {
            if !query.is_empty() {
                query.push('&');
            }
            query.push_str(k);
            query.push('=');
            push_percent_encoded(&mut query, v);
        }
        if !query.is_empty() {
            path.push('?');
            path.push_str(&query);
        }
        WsTarget {
            host: self.host.clone(),
            port: self.port,
            host_header: self.host_header.clone(),
            path_and_query: path,
        }
    }
}

/// Percent-encode everything except RFC 3986 unreserved characters.
pub(crate) fn push_percent_encoded(out: &mut String, s: &str) {
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

/// Encode a path segment: like [`push_percent_encoded`] but keeps the
/// characters a path segment allows unescaped that channel names use
/// (`:@=`), so `chat:1` stays readable in logs.
pub fn encode_path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b':' | b'@' | b'=') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_base_gets_ws_path_and_params() {
        let b = BaseUrl::parse("http://127.0.0.1:8080").unwrap();
        let t = b.ws_target(&[("user", "alice b"), ("device", "d/1")]);
        assert_eq!(t.host, "127.0.0.1");
        assert_eq!(t.port, 8080);
        assert_eq!(t.host_header, "127.0.0.1:8080");
        assert_eq!(t.path_and_query, "/ws?user=alice%20b&device=d%2F1");
    }

    #[test]
    fn keeps_existing_ws_path_prefix_and_query() {
        let t = BaseUrl::parse("ws://localhost/ws").unwrap().ws_target(&[]);
        assert_eq!((t.port, t.path_and_query.as_str()), (80, "/ws"));
        let t = BaseUrl::parse("http://h:1/herald/?x=1").unwrap().ws_target(&[("token", "a.b-c_d")]);
        assert_eq!(t.path_and_query, "/herald/ws?x=1&token=a.b-c_d");
        let t = BaseUrl::parse("h:9").unwrap().ws_target(&[]);
        assert_eq!((t.host.as_str(), t.port), ("h", 9));
    }

    #[test]
    fn ipv6_host_is_unbracketed_for_connect_only() {
        let t = BaseUrl::parse("http://[::1]:7000").unwrap().ws_target(&[]);
        assert_eq!(t.host, "::1");
        assert_eq!(t.host_header, "[::1]:7000");
    }

    #[test]
    fn refuses_tls_and_garbage() {
        assert!(matches!(BaseUrl::parse("https://x"), Err(ClientError::Config(_))));
        assert!(matches!(BaseUrl::parse("wss://x"), Err(ClientError::Config(_))));
        assert!(BaseUrl::parse("ftp://x").is_err());
        assert!(BaseUrl::parse("").is_err());
    }

    #[test]
    fn path_segments_keep_channel_punctuation() {
        assert_eq!(encode_path_segment("chat:s-789_a.b@c=d"), "chat:s-789_a.b@c=d");
        assert_eq!(encode_path_segment("a b/c"), "a%20b%2Fc");
    }
}
