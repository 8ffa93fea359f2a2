use std::sync::Arc;

use herald_proto::{ErrorCode, MessageView, Problem};

/// Everything that can go wrong in the client.
///
/// Errors that come from the server keep the server's stable error `code`
/// (a string, so codes added after this client was built still come
/// through); [`ClientError::code`] and [`ClientError::error_code`] read it
/// whatever the variant. The type is `Clone` (sources are shared) so one
/// failure can be reported to every subscription of a client.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The server URL or an option could not be used.
    #[error("invalid client configuration: {0}")]
    Config(String),

    /// TCP connect or DNS resolution failed.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: Arc<std::io::Error>,
    },

    /// The server answered the WebSocket upgrade with something other than
    /// 101. `code` is the problem+json `code` when the body had one.
    #[error("server refused the WebSocket upgrade: HTTP {status}{}", fmt_code(code.as_deref()))]
    Rejected { status: u16, code: Option<String>, problem: Option<Box<Problem>>, body: String },

    /// The upgrade response was not a valid WebSocket handshake.
    #[error("WebSocket handshake failed: {0}")]
    Handshake(String),

    /// Reading or writing the socket failed.
    #[error("I/O error: {0}")]
    Io(#[source] Arc<std::io::Error>),

    /// The WebSocket layer failed (protocol violation, closed stream, ...).
    #[error("WebSocket error: {0}")]
    WebSocket(#[source] Arc<tokio_websockets::Error>),

    /// The server sent something that is not a Herald frame.
    #[error("unexpected frame from the server: {0}")]
    Protocol(String),

    /// The server answered a request with an `error` frame.
    #[error("server error `{code}`: {message}")]
    Server { code: String, message: String, channel: Option<String> },

    /// The socket closed. `code` is the WebSocket close code when the server
    /// sent a close frame.
    #[error("connection closed{}: {reason}", fmt_close(*code))]
    Closed { code: Option<u16>, reason: String },

    /// The server sent `disconnect` with `reconnect: false` (or closed with a
    /// code that forbids reconnecting); the client gave up.
    #[error("disconnected by the server ({code}): {reason}")]
    Disconnected { code: u16, reason: String },

    /// The connection was lost while a request was in flight; the request
    /// may or may not have taken effect. Retry a publish with the same
    /// idempotency key to get exactly-once effect.
    #[error("connection lost while the request was in flight")]
    ConnectionLost,

    /// Reconnecting failed `attempts` times in a row.
    #[error("gave up after {attempts} reconnect attempts; last error: {last}")]
    ReconnectExhausted { attempts: u32, last: Box<ClientError> },

    /// No reply within the configured timeout.
    #[error("timed out")]
    Timeout,

    /// Too many requests are waiting for a connection.
    #[error("too many requests waiting for a connection")]
    Backlog,

    /// The client (or its background task) has shut down.
    #[error("the client is shut down")]
    Shutdown,

    /// This client already has a subscription to the channel.
    #[error("already subscribed to `{0}` on this client")]
    AlreadySubscribed(String),

    /// The HTTP API answered with a non-2xx status.
    #[error("HTTP API error: HTTP {status}{}", fmt_code(problem.as_ref().map(|p| p.code.as_str())))]
    Api { status: u16, problem: Option<Box<Problem>>, body: String },

    /// The HTTP request itself failed (connect, read, decode).
    #[error("HTTP request failed: {0}")]
    Http(#[source] Arc<reqwest::Error>),
}

fn fmt_code(code: Option<&str>) -> String {
    code.map(|c| format!(" ({c})")).unwrap_or_default()
}

fn fmt_close(code: Option<u16>) -> String {
    code.map(|c| format!(" with code {c}")).unwrap_or_default()
}

impl ClientError {
    /// The server's error code, whichever way it arrived: an `error` frame,
    /// a problem+json body on a refused upgrade or an API call.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Server { code, .. } => Some(code),
            Self::Rejected { code, .. } => code.as_deref(),
            Self::Api { problem, .. } => problem.as_ref().map(|p| p.code.as_str()),
            Self::ReconnectExhausted { last, .. } => last.code(),
            _ => None,
        }
    }

    /// [`ClientError::code`] as a known [`ErrorCode`] (`None` for codes this
    /// build does not know).
    pub fn error_code(&self) -> Option<ErrorCode> {
        self.code().and_then(parse_error_code)
    }

    /// The HTTP status of a refused upgrade or a failed API call.
    pub fn http_status(&self) -> Option<u16> {
        match self {
            Self::Rejected { status, .. } | Self::Api { status, .. } => Some(*status),
            Self::ReconnectExhausted { last, .. } => last.http_status(),
            _ => None,
        }
    }

    /// The WebSocket close code the server ended the connection with.
    pub fn close_code(&self) -> Option<u16> {
        match self {
            Self::Closed { code, .. } => *code,
            Self::Disconnected { code, .. } => Some(*code),
            Self::ReconnectExhausted { last, .. } => last.close_code(),
            _ => None,
        }
    }

    /// Build the error for an `error` frame.
    pub(crate) fn from_error_frame(view: &MessageView) -> Self {
        Self::Server {
            code: view_code(view).unwrap_or_else(|| "unknown".to_owned()),
            message: view.message.clone().unwrap_or_default(),
            channel: view.channel.clone(),
        }
    }
}

/// The `code` of an `error` frame as a string.
pub(crate) fn view_code(view: &MessageView) -> Option<String> {
    match view.code.as_ref()? {
        serde_json::Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

pub(crate) fn parse_error_code(code: &str) -> Option<ErrorCode> {
    serde_json::from_value(serde_json::Value::String(code.to_owned())).ok()
}

impl From<std::io::Error> for ClientError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(Arc::new(e))
    }
}

impl From<tokio_websockets::Error> for ClientError {
    fn from(e: tokio_websockets::Error) -> Self {
        match e {
            tokio_websockets::Error::Io(io) => Self::Io(Arc::new(io)),
            other => Self::WebSocket(Arc::new(other)),
        }
    }
}

impl From<reqwest::Error> for ClientError {
    fn from(e: reqwest::Error) -> Self {
        Self::Http(Arc::new(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_is_preserved_across_variants() {
        let e = ClientError::Rejected {
            status: 401,
            code: Some("unauthorized".into()),
            problem: None,
            body: String::new(),
        };
        assert_eq!(e.code(), Some("unauthorized"));
        assert_eq!(e.error_code(), Some(ErrorCode::Unauthorized));
        assert_eq!(e.http_status(), Some(401));
        assert_eq!(e.to_string(), "server refused the WebSocket upgrade: HTTP 401 (unauthorized)");

        let e =
            ClientError::Server { code: "a_code_from_the_future".into(), message: "m".into(), channel: None };
        assert_eq!(e.code(), Some("a_code_from_the_future"));
        assert_eq!(e.error_code(), None);

        let e = ClientError::ReconnectExhausted {
            attempts: 3,
            last: Box::new(ClientError::Closed { code: Some(4008), reason: "slow consumer".into() }),
        };
        assert_eq!(e.close_code(), Some(4008));
    }
}
