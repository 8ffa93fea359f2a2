//! Publishing, shared by the HTTP API, WebSocket clients and the outbox
//! consumers: validation, idempotency scoping, the in-flight guard, the key
//! protocol of a message to several channels, and the engine call.
//!
//! Exactly-once rests on the engine: dedup and append are one atomic step
//! there. The in-flight set only turns a concurrent retry on this node into a
//! clear 409 instead of a wait.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herald_core::{AppendRequest, Dedup, NamespaceOptions, Receipt};
use herald_proto::{check_data, ChannelName, ErrorCode, Meta};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use tracing::Instrument;

use crate::config::Config;
use crate::error::ApiError;
use crate::state::AppState;

/// The channels of a message to several channels, each resolved to its
/// namespace.
pub type Targets<'a> = Vec<(ChannelName, &'a NamespaceOptions)>;

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

/// An `Idempotency-Key` within its scope: the credential that sent it (an
/// API key for both HTTP publish endpoints, a token `sub` for socket
/// publishes), never the route. Raw keys are never stored or logged: the
/// engine sees only hashes of them.
///
/// One request under a key appends to one or more channels. The append to
/// its first channel carries the [anchor](ScopedKey::anchor), the same for
/// every request under the key whatever its route or channels; the others
/// carry a per-channel key. Every append carries the request's
/// [`fingerprint`]. So the anchor decides: the same request again is a
/// replay, another request under the key is a mismatch (422) before
/// anything else is appended.
pub struct ScopedKey {
    scope_and_key: Sha256,
}

impl ScopedKey {
    pub fn new(scope: &str, key: &str) -> Self {
        let mut h = Sha256::new();
        put(&mut h, scope.as_bytes());
        put(&mut h, key.as_bytes());
        Self { scope_and_key: h }
    }

    /// The dedup key of a request's first channel (and the in-flight key of
    /// the whole request).
    pub fn anchor(&self) -> Arc<str> {
        hex_key(self.scope_and_key.clone().finalize().into())
    }

    /// The dedup key of a later channel of a batch.
    pub fn for_channel(&self, channel: &ChannelName) -> Arc<str> {
        let mut h = self.scope_and_key.clone();
        h.update(b"channel\0");
        put(&mut h, channel.as_str().as_bytes());
        hex_key(h.finalize().into())
    }
}

/// A digest as the lowercase hex key the engines store (`hex::encode`'s
/// text, without its character-by-character `String`).
fn hex_key(digest: [u8; 32]) -> Arc<str> {
    let mut out = [0u8; 64];
    hex::encode_to_slice(digest, &mut out).expect("64 hex digits for 32 bytes");
    Arc::from(std::str::from_utf8(&out).expect("hex digits are ASCII"))
}

/// Hash one length-prefixed field, so no two field lists hash alike.
fn put(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_be_bytes());
    h.update(bytes);
}

/// What makes a retry "the same request", whichever endpoint it came
/// through: the channels in the order given (the single-channel endpoint and
/// a socket publish count as a list of one), `data` byte for byte as sent,
/// and `meta` as a map (entry order does not matter; no `meta` and `{}` are
/// the same).
pub fn fingerprint(channels: &[ChannelName], data: &RawValue, meta: Option<&Meta>) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"herald publish v2\0");
    h.update((channels.len() as u64).to_be_bytes());
    for ch in channels {
        put(&mut h, ch.as_str().as_bytes());
    }
    put(&mut h, data.get().as_bytes());
    let entries = meta.map_or(0, |m| m.len());
    h.update((entries as u64).to_be_bytes());
    for (k, v) in meta.into_iter().flatten() {
        put(&mut h, k.as_bytes());
        put(&mut h, v.as_bytes());
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

impl AppState {
    /// A channel name checked and resolved to its namespace.
    pub fn resolve_channel(&self, name: &str) -> Result<(ChannelName, &NamespaceOptions), ApiError> {
        let channel =
            ChannelName::new(name).map_err(|e| ApiError::new(ErrorCode::BadChannel, e.to_string()))?;
        let ns = self.config().namespaces.resolve(&channel)?;
        Ok((channel, ns))
    }

    /// The channels of a message to several channels: 1..=
    /// `publish.max_batch_channels`, each valid, in a namespace, and named
    /// once.
    pub fn batch_targets(&self, channels: &[String]) -> Result<Targets<'_>, ApiError> {
        let max = self.config().publish.max_batch_channels;
        if channels.is_empty() || channels.len() > max {
            return Err(ApiError::new(
                ErrorCode::BadRequest,
                format!("`channels` must name 1..={max} channels"),
            ));
        }
        let mut targets = Vec::with_capacity(channels.len());
        for name in channels {
            let (channel, ns) = self.resolve_channel(name)?;
            if targets.iter().any(|(c, _)| c == &channel) {
                return Err(ApiError::new(
                    ErrorCode::BadRequest,
                    format!("channel `{channel}` is named twice"),
                ));
            }
            targets.push((channel, ns));
        }
        Ok(targets)
    }

    /// Append one message to several channels under the key protocol of a
    /// batch (see [`ScopedKey`]), one outcome per target in order. The
    /// caller checked the targets ([`AppState::batch_targets`]) and `data`;
    /// this first refuses the whole message if a room among the targets does
    /// not exist. Without a key, every channel goes to the engine as one
    /// submission (one group commit). With a key, the message holds its
    /// anchor's in-flight claim throughout, and its first channel's append
    /// decides whether it is new, a replay or a mismatch before any other
    /// channel is appended: a mismatch there (another request under this
    /// key) appends nothing anywhere, and any other failure there leaves the
    /// rest to the retry. Each other channel's append is deduplicated on its
    /// own, so a retry of a partly failed message completes it without
    /// doubling any channel.
    pub async fn publish_to_channels(
        &self,
        scope: &str,
        key: Option<&str>,
        targets: &Targets<'_>,
        data: &RawValue,
        meta: &Option<Meta>,
    ) -> Result<Vec<Result<Receipt, ApiError>>, ApiError> {
        crate::rooms::require_rooms(self, targets).await?;
        let names: Vec<ChannelName> = targets.iter().map(|(c, _)| c.clone()).collect();
        let fp = fingerprint(&names, data, meta.as_ref());
        let scoped = key.map(|k| ScopedKey::new(scope, k));
        let _claim = match &scoped {
            Some(s) => Some(self.in_flight.claim(&s.anchor())?),
            None => None,
        };
        let message = |i: usize| {
            let channel = &targets[i].0;
            let dedup = scoped.as_ref().map(|s| {
                let key = if i == 0 { s.anchor() } else { s.for_channel(channel) };
                (key, fp)
            });
            Publish { channel: channel.clone(), data: data.to_owned(), meta: meta.clone(), dedup }
        };
        let publish_all =
            |from: usize| self.publish_many((from..targets.len()).map(|i| Ok(message(i))).collect(), false);
        let mut outcomes = Vec::with_capacity(targets.len());
        if scoped.is_some() {
            let first = self.publish_claimed(targets[0].1, message(0)).await;
            let skipped = first.as_ref().err().map(|e| {
                ApiError::new(
                    e.code,
                    format!("not attempted: the batch's first channel failed ({})", e.detail),
                )
            });
            outcomes.push(first);
            match skipped {
                None => outcomes.extend(publish_all(1).await),
                Some(e) => outcomes.extend((1..targets.len()).map(|_| Err(e.clone()))),
            }
        } else {
            outcomes.extend(publish_all(0).await);
        }
        Ok(outcomes)
    }

    /// The checks of `data` every publish path applies before anything is
    /// appended: size, then the rules of [`check_data`] (what is stored must
    /// be servable to every client as it is).
    pub fn check_publish_data(&self, data: &RawValue) -> Result<(), ApiError> {
        check_publish_data_in(self.config(), data)
    }

    /// Append one message through the engine. The caller has checked
    /// permissions; this checks namespace rules and `data`, and holds the
    /// in-flight claim of its dedup key while it runs.
    pub async fn publish(&self, ns: &NamespaceOptions, p: Publish) -> Result<Receipt, ApiError> {
        self.check_publish_data(&p.data)?;
        let _guard = match &p.dedup {
            Some((key, _)) => Some(self.in_flight.claim(key)?),
            None => None,
        };
        self.append(ns, p).await
    }

    /// [`AppState::publish`] for a caller that holds the in-flight claim of the
    /// request's key already (a batch holds its anchor for all channels).
    pub async fn publish_claimed(&self, ns: &NamespaceOptions, p: Publish) -> Result<Receipt, ApiError> {
        self.check_publish_data(&p.data)?;
        self.append(ns, p).await
    }

    /// Publish several messages as one engine submission
    /// ([`Log::append_batch`](herald_core::Log::append_batch): one queue
    /// hand-off, one group commit on the embedded engine), results in the
    /// order given; per channel the messages are appended in that order.
    /// Each item is checked as [`AppState::publish`] checks it (namespace
    /// rules, `data`, rooms) and one refused item affects no other; an item
    /// that is already an `Err` is passed through. With `claim`, each item
    /// holds the in-flight claim of its dedup key until the batch is
    /// answered (a second item of the batch under the same key gets 409);
    /// without, the caller holds the claims.
    pub async fn publish_many(
        &self,
        items: Vec<Result<Publish, ApiError>>,
        claim: bool,
    ) -> Vec<Result<Receipt, ApiError>> {
        // One configuration for the whole batch: each item is checked and
        // made a request against the same snapshot (a load per use was
        // several atomic loads per publish).
        let config = self.config();
        let mut guards = Vec::new();
        let mut reqs = Vec::with_capacity(items.len());
        // Per item: its request's index in `reqs`, or why it was refused.
        let mut slots: Vec<Result<usize, ApiError>> = Vec::with_capacity(items.len());
        for item in items {
            let slot = match item {
                Ok(p) => match self.prepare(config, p, claim, &mut guards).await {
                    Ok(req) => {
                        reqs.push(req);
                        Ok(reqs.len() - 1)
                    }
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            slots.push(slot);
        }
        let started = Instant::now();
        let span = tracing::trace_span!(target: crate::trace::TARGET, "herald.append", messages = reqs.len());
        let mut results: Vec<Option<Result<Receipt, herald_core::EngineError>>> =
            self.engine.append_batch(reqs).instrument(span).await.into_iter().map(Some).collect();
        // Every item of the batch was answered at once: one latency for all.
        let latency = started.elapsed();
        drop(guards);
        slots
            .into_iter()
            .map(|slot| {
                let i = slot?;
                let result = results.get_mut(i).and_then(Option::take).unwrap_or_else(|| {
                    Err(herald_core::EngineError::Failed("no result from the engine".into()))
                });
                self.account(result, latency)
            })
            .collect()
    }

    /// One item of [`AppState::publish_many`], checked and made a request.
    async fn prepare<'a>(
        &'a self,
        config: &Config,
        p: Publish,
        claim: bool,
        guards: &mut Vec<InFlightGuard<'a>>,
    ) -> Result<AppendRequest, ApiError> {
        let ns = config.namespaces.resolve(&p.channel)?;
        check_publish_data_in(config, &p.data)?;
        if let (true, Some((key, _))) = (claim, &p.dedup) {
            guards.push(self.in_flight.claim(key)?);
        }
        if ns.room && self.engine.room(&p.channel).await?.is_none() {
            return Err(crate::rooms::no_such_room());
        }
        // Before the append: the webhooks' cursors, so their work is found
        // again after a crash (webhooks/mod.rs).
        self.webhooks.ensure(&*self.engine, ns, &p.channel).await?;
        Ok(request(config, ns, p))
    }

    /// Count an engine outcome in the metrics and make it an API result.
    fn account(
        &self,
        result: Result<Receipt, herald_core::EngineError>,
        latency: Duration,
    ) -> Result<Receipt, ApiError> {
        match result {
            Ok(receipt) => {
                self.webhooks.appended(&receipt.channel);
                if receipt.duplicate {
                    self.metrics.dedup_hits.inc();
                } else {
                    self.metrics.published.inc();
                    self.metrics.publish_latency.observe(latency.as_secs_f64());
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

    async fn append(&self, ns: &NamespaceOptions, p: Publish) -> Result<Receipt, ApiError> {
        if ns.room && self.engine.room(&p.channel).await?.is_none() {
            return Err(crate::rooms::no_such_room());
        }
        self.webhooks.ensure(&*self.engine, ns, &p.channel).await?;
        let started = Instant::now();
        let req = request(self.config(), ns, p);
        let span = tracing::trace_span!(target: crate::trace::TARGET, "herald.append", messages = 1);
        let result = self.engine.append(req).instrument(span).await;
        self.account(result, started.elapsed())
    }
}

/// [`AppState::check_publish_data`] against one configuration snapshot.
fn check_publish_data_in(config: &Config, data: &RawValue) -> Result<(), ApiError> {
    let max_bytes = config.websocket.max_message_bytes;
    if data.get().len() > max_bytes {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("`data` is larger than {max_bytes} bytes"),
        ));
    }
    check_data(data, config.publish.max_data_depth)
        .map_err(|e| ApiError::new(ErrorCode::BadData, e.to_string()))
}

/// The engine request of a checked publish.
fn request(config: &Config, ns: &NamespaceOptions, p: Publish) -> AppendRequest {
    AppendRequest {
        meta: p.meta,
        dedup: p.dedup.map(|(key, fingerprint)| Dedup { key, fingerprint, ttl: config.idempotency_ttl }),
        ..AppendRequest::message(p.channel, p.data, ns.is_durable(), ns.retention())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    fn chans(names: &[&str]) -> Vec<ChannelName> {
        names.iter().map(|n| ChannelName::new(n).unwrap()).collect()
    }

    #[test]
    fn the_fingerprint_compares_channels_data_and_meta_only() {
        let meta = |pairs: &[(&str, &str)]| {
            Some(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Meta>())
        };
        let fp = |c: &[&str], d: &str, m: Option<Meta>| fingerprint(&chans(c), &raw(d), m.as_ref());
        let base = fp(&["a:1"], "{\"x\":1}", meta(&[("k", "v"), ("j", "w")]));
        assert_eq!(base, fp(&["a:1"], "{\"x\":1}", meta(&[("j", "w"), ("k", "v")])), "meta is a map");
        assert_eq!(fp(&["a:1"], "1", None), fp(&["a:1"], "1", meta(&[])), "no meta is {{}}");
        assert_ne!(base, fp(&["a:1"], "{\"x\": 1}", meta(&[("k", "v"), ("j", "w")])), "data byte for byte");
        assert_ne!(fp(&["a:1", "a:2"], "1", None), fp(&["a:2", "a:1"], "1", None), "channels in order");
        // Length prefixes: no two field lists hash alike.
        assert_ne!(fp(&["a:1"], "1", meta(&[("a=b", "c")])), fp(&["a:1"], "1", meta(&[("a", "b=c")])));
        assert_ne!(fp(&["a:1", "a:2"], "1", None), fp(&["a:1"], "1", None));
    }

    #[test]
    fn keys_are_scoped_by_credential_and_anchored_per_request() {
        let k = ScopedKey::new("api:1", "key");
        assert_eq!(k.anchor(), ScopedKey::new("api:1", "key").anchor());
        assert_ne!(k.anchor(), ScopedKey::new("api:2", "key").anchor());
        assert_ne!(ScopedKey::new("api:1", "k\ney").anchor(), ScopedKey::new("api:1\nk", "ey").anchor());
        let ch = ChannelName::new("a:1").unwrap();
        assert_ne!(k.for_channel(&ch), k.anchor());
        assert_ne!(k.for_channel(&ch), k.for_channel(&ChannelName::new("a:2").unwrap()));
        assert!(!k.anchor().contains("key"), "never the raw key");
        // The stored form: 64 lowercase hex digits of the SHA-256, as
        // `hex::encode` wrote it before (receipts stored then still match).
        let mut h = Sha256::new();
        put(&mut h, b"api:1");
        put(&mut h, b"key");
        assert_eq!(&*k.anchor(), hex::encode(h.finalize()));
    }
}
