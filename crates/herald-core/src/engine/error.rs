//! Why an engine call failed.

/// The error of every engine call but an ack ([`AckError`](super::AckError)
/// wraps it).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum EngineError {
    /// The dedup key was used before with a different fingerprint.
    #[error("idempotency key was used with a different request")]
    IdempotencyMismatch,
    /// Transient: retry later (the server answers 503 with Retry-After).
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// Fail-stop: a storage I/O error happened; the engine refuses writes.
    #[error("storage failed: {0}")]
    Failed(String),
    /// The engine is closing.
    #[error("storage is shutting down")]
    ShuttingDown,
    /// The channel was closed (a closed room): nothing more is appended.
    #[error("the channel is closed")]
    Closed,
}
