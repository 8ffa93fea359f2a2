use serde::Serialize;

/// WebSocket close codes Herald uses. Application reasons are in the 4000s;
/// the table is documented in `docs/protocol.md` and must only grow.
pub mod close {
    /// Server shutting down (RFC 6455 "going away").
    pub const GOING_AWAY: u16 = 1001;
    /// A frame exceeded `max_message_bytes` (RFC 6455 "message too big").
    pub const MESSAGE_TOO_BIG: u16 = 1009;
    /// Internal server error.
    pub const INTERNAL: u16 = 1011;
    /// The client sent something that is not a Herald frame (binary, not JSON, ...).
    pub const BAD_REQUEST: u16 = 4000;
    /// Authentication failed or was revoked.
    pub const UNAUTHORIZED: u16 = 4001;
    /// The token expired while connected; reconnect with a fresh token.
    pub const TOKEN_EXPIRED: u16 = 4003;
    /// Nothing received within the idle timeout.
    pub const IDLE_TIMEOUT: u16 = 4004;
    /// The log was reset or trimmed past this client's position while it
    /// was subscribed; resubscribe with `since` and the reply says what
    /// happened (`epoch_changed` or `truncated`).
    pub const RESYNC: u16 = 4005;
    /// The connection's outbox overflowed; resume from the last seq.
    pub const SLOW_CONSUMER: u16 = 4008;
    /// The client sent frames faster than allowed.
    pub const RATE_LIMITED: u16 = 4009;
    /// The node is draining (a deploy): reconnect now, without backoff, to
    /// another node, and resume.
    pub const DRAINING: u16 = 4010;
    /// The backend disconnected this connection through the API
    /// (`POST /api/v1/users/{user}/disconnect` with `reconnect: true`):
    /// reconnect (with backoff) and resume.
    pub const DISCONNECTED: u16 = 4011;
    /// The backend disconnected this connection for good (`reconnect:
    /// false`, a ban): do not reconnect.
    pub const DISCONNECTED_FOR_GOOD: u16 = 4012;
}

/// Every wire-visible error, with a stable string code.
///
/// One place maps a code to its HTTP status and WebSocket close code; codes
/// are never renamed, only added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Malformed request: missing field, wrong type, unknown frame type.
    BadRequest,
    /// The body or frame is not valid JSON.
    BadJson,
    /// The channel name is not valid.
    BadChannel,
    /// `data` is JSON but breaks the publish rules (nesting depth, a lone
    /// UTF-16 surrogate): see `check_data`.
    BadData,
    /// The channel's namespace is not configured.
    UnknownNamespace,
    /// No or invalid credentials.
    Unauthorized,
    /// The token expired.
    TokenExpired,
    /// Authenticated, but not allowed to do this.
    Forbidden,
    /// A browser page on an origin that is not allowed opened `/ws`.
    OriginNotAllowed,
    /// No such resource.
    NotFound,
    /// The resource exists but not with this HTTP method.
    MethodNotAllowed,
    /// The request's body did not arrive in time.
    RequestTimeout,
    /// The request line and headers are larger than the configured limit.
    HeadersTooLarge,
    /// Body or frame above the configured size limit.
    PayloadTooLarge,
    /// The namespace requires an `Idempotency-Key`.
    IdempotencyKeyRequired,
    /// The `Idempotency-Key` is empty or longer than 255 characters.
    IdempotencyKeyInvalid,
    /// The `Idempotency-Key` was used before with a different request.
    IdempotencyKeyReused,
    /// A request with this `Idempotency-Key` is still being processed.
    IdempotencyKeyInFlight,
    /// The subscription already exists on this connection.
    AlreadySubscribed,
    /// The channel is not subscribed on this connection.
    NotSubscribed,
    /// Too many subscriptions on this connection.
    TooManySubscriptions,
    /// The operation is not available for this channel's delivery mode.
    NotSupported,
    /// The request rate or connection limit was exceeded.
    RateLimited,
    /// The server is at its connection limit.
    TooManyConnections,
    /// The resource exists already (`PUT` of an existing room), or the change
    /// is not a legal transition from the current state.
    Conflict,
    /// `If-Match` named a version that is not the current one.
    PreconditionFailed,
    /// The channel was closed for good (a closed room): no more publishes.
    ChannelClosed,
    /// The user (or device) is banned: the backend refused its connections
    /// until a time (`POST /api/v1/users/{user}/disconnect` with
    /// `ban_seconds`).
    Banned,
    /// The storage engine cannot take writes or reads right now. Retry later.
    Unavailable,
    /// The server is shutting down.
    ShuttingDown,
    /// A bug or unexpected failure on the server side.
    Internal,
}

impl ErrorCode {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::BadRequest => "bad_request",
            Self::BadJson => "bad_json",
            Self::BadChannel => "bad_channel",
            Self::BadData => "bad_data",
            Self::UnknownNamespace => "unknown_namespace",
            Self::Unauthorized => "unauthorized",
            Self::TokenExpired => "token_expired",
            Self::Forbidden => "forbidden",
            Self::OriginNotAllowed => "origin_not_allowed",
            Self::NotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::RequestTimeout => "request_timeout",
            Self::HeadersTooLarge => "headers_too_large",
            Self::PayloadTooLarge => "payload_too_large",
            Self::IdempotencyKeyRequired => "idempotency_key_required",
            Self::IdempotencyKeyInvalid => "idempotency_key_invalid",
            Self::IdempotencyKeyReused => "idempotency_key_reused",
            Self::IdempotencyKeyInFlight => "idempotency_key_in_flight",
            Self::AlreadySubscribed => "already_subscribed",
            Self::NotSubscribed => "not_subscribed",
            Self::TooManySubscriptions => "too_many_subscriptions",
            Self::NotSupported => "not_supported",
            Self::RateLimited => "rate_limited",
            Self::TooManyConnections => "too_many_connections",
            Self::Conflict => "conflict",
            Self::PreconditionFailed => "precondition_failed",
            Self::ChannelClosed => "channel_closed",
            Self::Banned => "banned",
            Self::Unavailable => "unavailable",
            Self::ShuttingDown => "shutting_down",
            Self::Internal => "internal",
        }
    }

    /// The HTTP status for this code. Internal failures are 5xx, never 4xx.
    pub const fn http_status(self) -> u16 {
        match self {
            Self::BadRequest
            | Self::BadJson
            | Self::BadChannel
            | Self::BadData
            | Self::IdempotencyKeyRequired
            | Self::IdempotencyKeyInvalid => 400,
            Self::Unauthorized | Self::TokenExpired => 401,
            Self::Forbidden | Self::OriginNotAllowed | Self::Banned => 403,
            Self::NotFound | Self::UnknownNamespace => 404,
            Self::NotSupported | Self::MethodNotAllowed => 405,
            Self::RequestTimeout => 408,
            Self::AlreadySubscribed | Self::NotSubscribed | Self::IdempotencyKeyInFlight | Self::Conflict => {
                409
            }
            Self::ChannelClosed => 410,
            Self::PreconditionFailed => 412,
            Self::PayloadTooLarge => 413,
            Self::HeadersTooLarge => 431,
            Self::IdempotencyKeyReused => 422,
            Self::TooManySubscriptions | Self::RateLimited => 429,
            Self::Internal => 500,
            Self::Unavailable | Self::ShuttingDown | Self::TooManyConnections => 503,
        }
    }

    /// The close code used when this error ends a WebSocket connection.
    pub const fn close_code(self) -> u16 {
        match self {
            Self::Unauthorized | Self::Forbidden | Self::OriginNotAllowed => close::UNAUTHORIZED,
            Self::TokenExpired => close::TOKEN_EXPIRED,
            Self::Banned => close::DISCONNECTED_FOR_GOOD,
            Self::PayloadTooLarge => close::MESSAGE_TOO_BIG,
            Self::RateLimited | Self::TooManySubscriptions => close::RATE_LIMITED,
            Self::ShuttingDown => close::GOING_AWAY,
            Self::Internal | Self::Unavailable | Self::TooManyConnections => close::INTERNAL,
            _ => close::BAD_REQUEST,
        }
    }

    /// A short human title for problem+json.
    pub const fn title(self) -> &'static str {
        match self {
            Self::BadRequest => "Bad request",
            Self::BadJson => "Body is not valid JSON",
            Self::BadChannel => "Invalid channel name",
            Self::BadData => "`data` not accepted",
            Self::UnknownNamespace => "Unknown channel namespace",
            Self::Unauthorized => "Unauthorized",
            Self::TokenExpired => "Token expired",
            Self::Forbidden => "Forbidden",
            Self::OriginNotAllowed => "Origin not allowed",
            Self::NotFound => "Not found",
            Self::MethodNotAllowed => "Method not allowed",
            Self::RequestTimeout => "Request timeout",
            Self::HeadersTooLarge => "Request headers too large",
            Self::PayloadTooLarge => "Payload too large",
            Self::IdempotencyKeyRequired => "Idempotency-Key required",
            Self::IdempotencyKeyInvalid => "Invalid Idempotency-Key",
            Self::IdempotencyKeyReused => "Idempotency-Key reused with a different request",
            Self::IdempotencyKeyInFlight => "A request with this Idempotency-Key is in flight",
            Self::AlreadySubscribed => "Already subscribed",
            Self::NotSubscribed => "Not subscribed",
            Self::TooManySubscriptions => "Too many subscriptions",
            Self::NotSupported => "Not supported for this channel",
            Self::RateLimited => "Rate limited",
            Self::TooManyConnections => "Too many connections",
            Self::Conflict => "Conflict",
            Self::PreconditionFailed => "Precondition failed",
            Self::ChannelClosed => "Channel closed",
            Self::Banned => "Banned",
            Self::Unavailable => "Storage unavailable",
            Self::ShuttingDown => "Server shutting down",
            Self::Internal => "Internal error",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An RFC 9457 problem document, as sent with `application/problem+json`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Problem {
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub code: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// The resource's current state, where the error is about it (a room on
    /// 409 and 412), so the caller can retry without another read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<serde_json::Value>,
}

impl Problem {
    pub fn new(code: ErrorCode, detail: impl Into<String>) -> Self {
        Self {
            kind: format!("urn:herald:error:{}", code.as_str()),
            title: code.title().to_owned(),
            status: code.http_status(),
            code: code.as_str().to_owned(),
            detail: detail.into(),
            current: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_name_matches_as_str() {
        for code in [
            ErrorCode::BadRequest,
            ErrorCode::IdempotencyKeyInFlight,
            ErrorCode::Unavailable,
            ErrorCode::TooManyConnections,
        ] {
            let s = serde_json::to_string(&code).unwrap();
            assert_eq!(s, format!("\"{}\"", code.as_str()));
        }
    }

    #[test]
    fn internal_failures_are_5xx() {
        assert_eq!(ErrorCode::Unavailable.http_status(), 503);
        assert_eq!(ErrorCode::Internal.http_status(), 500);
        assert_eq!(ErrorCode::IdempotencyKeyReused.http_status(), 422);
        assert_eq!(ErrorCode::IdempotencyKeyInFlight.http_status(), 409);
    }
}
