//! Publishing, shared by the HTTP API and WebSocket clients: validation,
//! idempotency scoping, the in-flight guard, and the engine call.
//!
//! Exactly-once rests on the engine: dedup and append are one atomic step
//! there. The in-flight set only turns a concurrent retry on this node into a
//! clear 409 instead of a wait.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use herald_core::{AppendRequest, Dedup, NamespaceOptions, Receipt};
use herald_proto::{ChannelName, ErrorCode, Meta};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::State;

/// Longest accepted `Idempotency-Key`.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

pub fn validate_idempotency_key(key: &str) -> Result<(), ApiError> {
    if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_LEN || key.chars().any(char::is_control) {
        return Err(ApiError::new(
            ErrorCode::IdempotencyKeyInvalid,
            format!("Idempotency-Key must be 1..={MAX_IDEMPOTENCY_KEY_LEN} printable characters"),
        ));
    }
    Ok(())
}

/// The engine-side dedup key: a hash of the credential scope, the client's
/// key and (for batches) the channel, so raw keys are never stored or logged.
pub fn scoped_key(scope: &str, key: &str, batch_channel: Option<&ChannelName>) -> Arc<str> {
    let mut h = Sha256::new();
    h.update(scope.as_bytes());
    h.update(b"\n");
    h.update(key.as_bytes());
    if let Some(ch) = batch_channel {
        h.update(b"\nbatch\n");
        h.update(ch.as_str().as_bytes());
    }
    Arc::from(hex::encode(h.finalize()))
}

/// Fingerprint of a request: what makes a retry "the same request".
pub fn fingerprint(kind: &str, channels: &[ChannelName], data: &RawValue, meta: Option<&Meta>) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(kind.as_bytes());
    for ch in channels {
        h.update(b"\0");
        h.update(ch.as_str().as_bytes());
    }
    h.update(b"\0data\0");
    h.update(data.get().as_bytes());
    if let Some(meta) = meta {
        for (k, v) in meta {
            h.update(b"\0");
            h.update(k.as_bytes());
            h.update(b"=");
            h.update(v.as_bytes());
        }
    }
    h.finalize().into()
}

/// Keys being processed on this node.
#[derive(Default)]
pub struct InFlight(Mutex<HashSet<Arc<str>>>);

pub struct InFlightGuard<'a> {
    set: &'a InFlight,
    key: Arc<str>,
}

impl InFlight {
    pub fn claim(&self, key: &Arc<str>) -> Result<InFlightGuard<'_>, ApiError> {
        let mut set = self.0.lock().expect("in-flight lock poisoned");
        if !set.insert(key.clone()) {
            return Err(ApiError::new(
                ErrorCode::IdempotencyKeyInFlight,
                "a request with this Idempotency-Key is still being processed; retry later",
            ));
        }
        Ok(InFlightGuard { set: self, key: key.clone() })
    }
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.set.0.lock().expect("in-flight lock poisoned").remove(&self.key);
    }
}

/// One message to publish.
pub struct Publish {
    pub channel: ChannelName,
    pub data: Box<RawValue>,
    pub meta: Option<Meta>,
    /// `(dedup key, fingerprint)`.
    pub dedup: Option<(Arc<str>, [u8; 32])>,
}

impl State {
    /// Append one message through the engine. The caller has checked
    /// permissions; this checks namespace rules and sizes.
    pub async fn publish(&self, ns: &NamespaceOptions, p: Publish) -> Result<Receipt, ApiError> {
        if p.data.get().len() > self.config.limits.max_message_bytes {
            return Err(ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!("`data` is larger than {} bytes", self.config.limits.max_message_bytes),
            ));
        }
        if ns.room && self.engine.room(&p.channel).await?.is_none() {
            return Err(crate::rooms::no_such_room());
        }
        let _guard = match &p.dedup {
            Some((key, _)) => Some(self.in_flight.claim(key)?),
            None => None,
        };
        let started = Instant::now();
        let req = AppendRequest {
            meta: p.meta,
            dedup: p.dedup.map(|(key, fingerprint)| Dedup {
                key,
                fingerprint,
                ttl: self.config.idempotency_ttl,
            }),
            ..AppendRequest::message(p.channel, p.data, ns.is_durable(), ns.retention())
        };
        match self.engine.append(req).await {
            Ok(receipt) => {
                if receipt.duplicate {
                    self.metrics.dedup_hits.inc();
                } else {
                    self.metrics.published.inc();
                    self.metrics.publish_latency.observe(started.elapsed().as_secs_f64());
                }
                Ok(receipt)
            }
            Err(e) => {
                if !matches!(
                    e,
                    herald_core::EngineError::IdempotencyMismatch | herald_core::EngineError::Closed
                ) {
                    self.metrics.engine_errors.inc();
                    tracing::warn!(error = %e, "publish failed in the engine");
                }
                Err(e.into())
            }
        }
    }
}
