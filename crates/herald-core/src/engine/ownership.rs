//! Work that any node could do but one node at a time must (a webhook's
//! delivery of one channel): an exclusive lease with a fencing token.

use std::time::Duration;

use async_trait::async_trait;

use super::EngineError;
use crate::presence::FenceToken;

/// The answer to [`Ownership::claim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owned {
    /// The caller holds the lease until now + ttl, with this token. A claim
    /// by the holder that still holds it keeps the token (a renewal); every
    /// take-over (a new holder, or the lease expired meanwhile) gets a token
    /// greater than every token handed out for the key before.
    Held(FenceToken),
    /// Another holder's lease has not expired.
    Busy,
    /// The engine serves one node only: no lease is needed, the caller owns
    /// the work and makes its own token.
    Local,
}

/// Exclusive leases on named pieces of work (see [`Owned`]). Leases are
/// timed by the engine's clock; a holder that cannot renew in time loses the
/// lease to the next claimant, and the fencing token lets whoever receives
/// the work's effects (a webhook backend) refuse the old holder's late
/// requests.
#[async_trait]
pub trait Ownership: Send + Sync + 'static {
    /// Take the lease `key` for `holder` until now + `ttl`, or renew it if
    /// `holder` holds it. Default: [`Owned::Local`] (one node).
    async fn claim(&self, _key: &str, _holder: &str, _ttl: Duration) -> Result<Owned, EngineError> {
        Ok(Owned::Local)
    }

    /// Give the lease `key` up if `holder` holds it.
    async fn release(&self, _key: &str, _holder: &str) -> Result<(), EngineError> {
        Ok(())
    }
}
