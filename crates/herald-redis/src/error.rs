//! Errors of opening the engine. Errors of engine calls are
//! `herald_core::EngineError` (every Redis failure is `Unavailable`:
//! transient, answered 503).

#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    #[error("invalid redis configuration: {0}")]
    Config(String),
    #[error("cannot connect to redis: {0}")]
    Connect(String),
}
