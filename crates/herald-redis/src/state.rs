//! [`EngineState`]: what the engine's handle and its background tasks
//! share (the connections, the key names, the counters, the fan-out), and
//! the steps every operation takes the same way: running a script, counting
//! a failure, the closed refusal, a message's event arguments and its
//! receipt. The operations are in `append.rs`, `read.rs`, `cursors.rs`,
//! `presence.rs`, `rooms.rs` and `schedules.rs`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use herald_core::{EngineError, FanoutSink, Receipt, Retention};
use herald_proto::ChannelName;
use uuid::Uuid;

use crate::conn::Redis;
use crate::fanout::Fanout;
use crate::frame::FrameTemplate;
use crate::keys::Keys;
use crate::reply::{Appended, Reply};
use crate::scripts::{Event, ScriptArgs};
use crate::stats::Counters;

/// Everything the engine's handle and its background tasks share.
pub(crate) struct EngineState {
    pub redis: Redis,
    pub keys: Keys,
    /// How long a presence sweeper's claim on a channel lasts.
    pub sweep_claim_ms: u64,
    pub counters: Counters,
    pub sink: OnceLock<Arc<dyn FanoutSink>>,
    pub closing: AtomicBool,
    pub fanout: Fanout,
    /// `(channel, subscriber key)` whose user-index entry is known written.
    pub indexed: Mutex<HashSet<(ChannelName, String)>>,
}

/// A fresh epoch (a UUIDv7), offered to a script for a channel that has none.
pub(crate) fn new_epoch() -> String {
    new_id()
}

/// A new UUIDv7 as text (a message id or an epoch), written without the
/// formatting machinery.
pub(crate) fn new_id() -> String {
    let mut buf = Uuid::encode_buffer();
    Uuid::now_v7().hyphenated().encode_lower(&mut buf).to_owned()
}

/// Milliseconds, at least 1.
pub(crate) fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl EngineState {
    pub fn new(redis: Redis, fanout: Fanout, keys: Keys, sweep_claim_ms: u64) -> Self {
        Self {
            redis,
            keys,
            sweep_claim_ms,
            counters: Counters::default(),
            sink: OnceLock::new(),
            closing: AtomicBool::new(false),
            fanout,
            indexed: Mutex::new(HashSet::new()),
        }
    }

    pub fn publish_cmd(&self) -> &'static str {
        if self.redis.cluster {
            "SPUBLISH"
        } else {
            "PUBLISH"
        }
    }

    /// Count a failed call (`unavailable`).
    pub fn failed<T>(&self, r: Result<T, EngineError>) -> Result<T, EngineError> {
        if r.is_err() {
            self.counters.unavailable.bump();
        }
        r
    }

    /// Run a script (failing fast while Redis is down), a failure counted.
    pub async fn run(&self, what: &'static str, args: &impl ScriptArgs) -> Result<Reply, EngineError> {
        self.failed(self.redis.run(what, args).await)
    }

    /// Refuse a write once `close` has begun.
    pub fn refuse_when_closing(&self) -> Result<(), EngineError> {
        if self.closing.load(Ordering::Acquire) {
            return Err(EngineError::ShuttingDown);
        }
        Ok(())
    }

    /// A write refused because the channel is closed, counted.
    pub fn refuse_closed(&self) -> EngineError {
        self.counters.closed_refused.bump();
        EngineError::Closed
    }

    /// Log and count a loss the scripts noticed (a meta missing while its
    /// log exists).
    pub fn note_lost_meta(&self, channel: &ChannelName, epoch: &str) {
        self.counters.data_loss_detected.bump();
        tracing::warn!(
            channel = %channel,
            new_epoch = epoch,
            "redis lost the channel's meta while its log exists; new epoch (clients resync)"
        );
    }

    /// The arguments of one message that `ROOM_WRITE` or `SCHED_DELIVER`
    /// appends to `ch`.
    pub fn event<'a>(
        &self,
        ch: &'a ChannelName,
        tpl: &'a FrameTemplate,
        id: &'a str,
        retention: &'a Retention,
    ) -> Event<'a> {
        Event {
            epoch: new_epoch(),
            retention,
            frame: tpl,
            id,
            channel: ch.as_str(),
            fan: self.keys.fan(ch),
            publish: self.publish_cmd(),
        }
    }

    /// The receipt of a message a script appended (not a duplicate); a
    /// lost meta it noticed is logged and counted.
    pub fn receipt(&self, ch: &ChannelName, id: &str, a: Appended) -> Receipt {
        if a.lost {
            self.note_lost_meta(ch, a.epoch.as_str());
        }
        Receipt {
            channel: ch.clone(),
            seq: a.seq,
            id: Arc::from(id),
            epoch: a.epoch,
            ts: a.ts,
            duplicate: false,
        }
    }
}
