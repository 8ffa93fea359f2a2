//! Staging one append into the writer's batch: the dedup check (requests
//! of the batch first, then the `idem` space; an expired receipt counts as
//! absent), the closed check, `seq = head + 1`, the UUIDv7 id, the frame
//! encoded once, the log entry, the channel meta, `max_len` trimming and
//! the receipt.
//!
//! Invariants: a refused append stages nothing; trimming deletes a prefix
//! of the log only, so it stays gap-free; a receipt is staged with the
//! append it describes, and its expiry-index entry with it.

use std::sync::Arc;

use bytes::Bytes;
use herald_core::{AppendRequest, EngineError, Epoch, Message, Receipt};
use herald_proto::{encode_frame, ChannelName};
use uuid::Uuid;

use crate::codec::{self, ChannelMeta, IdemRecord, KeyLayout, LogHeader};
use crate::stage::{PendingIdem, Stage, Staged, Staging};
use crate::storage::{Read, Space, StorageError, WriteSet};
use crate::writer::Writer;

/// Log entries one append deletes for `max_len` at most. Normally one; more
/// only after `max_len` shrank, and then the excess goes over a few appends
/// instead of stalling one batch.
const TRIM_BUDGET_PER_APPEND: u64 = 1024;

/// One append: dedup check, closed check, then append (durable) or
/// broadcast (volatile), then the receipt. Room writes and schedule
/// deliveries stage their append through this impl too.
impl Stage for AppendRequest {
    type Ok = Receipt;
    type Err = EngineError;
    const FSYNC: bool = true;

    fn stage(self, w: &mut Writer, st: &mut Staging) -> Staged<Self> {
        let req = self;
        let now = w.shared.clock.now_ms();
        let epoch = w.shared.storage.epoch().clone();
        // The expiry-index entry of an expired receipt this append replaces.
        let mut stale_exp_key = None;
        if let Some(dedup) = &req.dedup {
            let found;
            (found, stale_exp_key) = w.find_receipt(&dedup.key, &st.pending_idem, now)?;
            if let Some(rec) = found {
                if rec.fingerprint != dedup.fingerprint {
                    st.tally.dedup_mismatches += 1;
                    return Ok(Err(EngineError::IdempotencyMismatch));
                }
                st.tally.dedup_hits += 1;
                return Ok(Ok(receipt_from_record(&rec, &epoch)?));
            }
        }

        let channel = &req.channel;
        let before = *w.channel_meta(channel)?;
        // After the dedup check: a retry of an append made before the close
        // still gets its receipt.
        if before.closed {
            st.tally.closed_refused += 1;
            return Ok(Err(EngineError::Closed));
        }
        let id = Uuid::now_v7();
        let id_str: Arc<str> = codec::id_str(&id);
        let ts = now;
        let seq = if req.durable { Some(before.head + 1) } else { None };
        // Only a durable append can close (there is no final seq otherwise).
        let closes = req.closes && req.durable;
        let frame =
            Bytes::from(encode_frame(req.kind, channel, seq, &id_str, ts, &req.data, req.meta.as_ref()));
        let ws = &mut st.ws;
        if let Some(seq) = seq {
            let layout = w.shared.storage.key_layout();
            ws.put_with(
                Space::Log,
                |k| layout.push_log_key(k, channel.as_str(), seq),
                |v| codec::push_log_value(v, &LogHeader { ts, id }, &frame),
            );
            let meta = w.channel_meta(channel)?;
            // For a channel whose log was empty, `first` is already `seq`.
            meta.head = seq;
            meta.max_age = req.retention.max_age;
            meta.closed = closes;
            let old_first = meta.first;
            let trimmed = trim_to_len(layout, channel.as_str(), meta, req.retention.max_len, ws);
            // Its meta is staged with the batch (`Writer::stage_metas`)
            // when more than the head changed (format 2: the head is the
            // log's last entry, see `KeyLayout::lazy_head`).
            let more_than_head = ChannelMeta { head: before.head, ..*meta } != before;
            if !layout.lazy_head() || more_than_head {
                w.dirty_metas.insert(channel.clone());
            }
            if trimmed > 0 {
                st.tally.trimmed += trimmed;
                st.tally.unacked_trimmed +=
                    w.cursors.unacked_in(&w.shared.storage, channel, old_first, old_first + trimmed - 1)?;
            }
            st.tally.appends += 1;
        } else {
            st.tally.volatile += 1;
        }
        if let Some(dedup) = &req.dedup {
            let ttl_ms = u64::try_from(dedup.ttl.as_millis()).unwrap_or(u64::MAX);
            let rec = IdemRecord {
                fingerprint: dedup.fingerprint,
                channel: channel.as_str().to_owned(),
                seq,
                id,
                ts,
                epoch: epoch.as_str().to_owned(),
                expires_at: ts.saturating_add(ttl_ms),
            };
            stage_receipt(st, &dedup.key, rec, stale_exp_key);
        }
        let receipt = Receipt {
            channel: channel.clone(),
            seq,
            id: id_str.clone(),
            epoch: epoch.clone(),
            ts,
            duplicate: false,
        };
        let msg = Message { channel: channel.clone(), seq, id: id_str, ts, epoch, frame, closes };
        st.fanout.push(Arc::new(msg));
        Ok(Ok(receipt))
    }
}

/// Several appends of one caller, staged in order into one group commit and
/// answered together, each with its own result.
pub(crate) struct AppendBatch(pub Vec<AppendRequest>);

impl Stage for AppendBatch {
    type Ok = Vec<Result<Receipt, EngineError>>;
    /// Only [`EngineError::Failed`], for all of them: a refusal is one
    /// append's result.
    type Err = EngineError;
    const FSYNC: bool = true;

    fn requests(&self) -> usize {
        self.0.len()
    }

    fn stage(self, w: &mut Writer, st: &mut Staging) -> Staged<Self> {
        let mut results = Vec::with_capacity(self.0.len());
        for req in self.0 {
            results.push(req.stage(w, st)?);
        }
        Ok(Ok(results))
    }
}

impl Writer {
    /// The receipt under an idempotency key: staged by this batch, else
    /// stored and not expired. With an expired stored one, also the key of
    /// its expiry-index entry, which a new receipt under this key replaces
    /// (see [`stage_receipt`]).
    pub(crate) fn find_receipt(
        &self,
        key: &Arc<str>,
        pending_idem: &PendingIdem,
        now: u64,
    ) -> Result<(Option<IdemRecord>, Option<Vec<u8>>), StorageError> {
        if let Some(rec) = pending_idem.get(key) {
            return Ok((Some(rec.clone()), None));
        }
        let Some(v) = self.shared.storage.get(Space::Idem, key.as_bytes())? else { return Ok((None, None)) };
        let rec = IdemRecord::decode(&v)?;
        if rec.is_expired(now) {
            Ok((None, Some(codec::idem_exp_key(rec.expires_at, key.as_bytes()))))
        } else {
            Ok((Some(rec), None))
        }
    }
}

/// Stage a receipt with its expiry-index entry (replacing the expired
/// one's, `stale_exp_key`), visible to the rest of the batch.
pub(crate) fn stage_receipt(
    st: &mut Staging,
    key: &Arc<str>,
    rec: IdemRecord,
    stale_exp_key: Option<Vec<u8>>,
) {
    let ws = &mut st.ws;
    // Delete before put: if both keys are equal the put must win.
    if let Some(k) = stale_exp_key {
        ws.delete(Space::IdemExp, k);
    }
    ws.put_with(Space::Idem, |k| k.extend_from_slice(key.as_bytes()), |v| rec.push_encoded(v));
    ws.put_with(Space::IdemExp, |k| codec::push_idem_exp_key(k, rec.expires_at, key.as_bytes()), |_| ());
    st.pending_idem.insert(key.clone(), rec);
}

/// Delete the oldest entries beyond `max_len` (0 = no limit), at most
/// [`TRIM_BUDGET_PER_APPEND`]; returns how many. Deletes a prefix only, so
/// the log stays gap-free.
fn trim_to_len(
    layout: KeyLayout,
    channel: &str,
    meta: &mut ChannelMeta,
    max_len: u64,
    ws: &mut WriteSet,
) -> u64 {
    let len = meta.head + 1 - meta.first;
    if max_len == 0 || len <= max_len {
        return 0;
    }
    let excess = (len - max_len).min(TRIM_BUDGET_PER_APPEND);
    let log = layout.log(channel);
    for seq in meta.first..meta.first + excess {
        ws.delete_with(Space::Log, |k| log.push_key(k, seq));
    }
    meta.first += excess;
    excess
}

fn receipt_from_record(rec: &IdemRecord, store_epoch: &Epoch) -> Result<Receipt, StorageError> {
    let channel = ChannelName::new(&rec.channel)
        .map_err(|e| StorageError::Corrupt(format!("receipt with a bad channel name: {e}")))?;
    let epoch =
        if rec.epoch == store_epoch.as_str() { store_epoch.clone() } else { Epoch::new(rec.epoch.as_str()) };
    Ok(Receipt { channel, seq: rec.seq, id: codec::id_str(&rec.id), epoch, ts: rec.ts, duplicate: true })
}
