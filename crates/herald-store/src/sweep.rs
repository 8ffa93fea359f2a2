//! Retention by age and receipt expiry, run on the writer thread in bounded
//! slices between group commits.
//!
//! A sweep pass walks the `channels` space in key order from a cursor; each
//! slice looks at most [`CHANNELS_PER_SLICE`] channels and deletes at most
//! [`DELETES_PER_SLICE`] entries, then commits. While a pass has work left
//! the next slice runs right after the next batch of appends, so a large
//! backlog drains quickly without ever holding appends up for more than one
//! slice. A finished pass waits `sweep_interval` before the next.
//!
//! Age retention deletes a prefix of a log (the oldest entries, while their
//! `ts` is older than the cutoff) and advances `first` in the same commit, so
//! the log stays gap-free. It stops at the first entry young enough: `ts`
//! only grows along a log (see `Clock`); should the wall clock have jumped
//! back across a restart, the sweep keeps more than it must, never less.

use std::ops::{Bound, ControlFlow};
use std::time::Instant;

use herald_proto::ChannelName;

use crate::codec::{self, ChannelMeta, IdemRecord};
use crate::storage::{Read, Space, StorageError, WriteSet};
use crate::writer::Writer;
use crate::FsyncMode;

/// Channel metas one slice looks at, at most.
const CHANNELS_PER_SLICE: usize = 1024;
/// Entries (messages and receipts) one slice deletes, at most.
const DELETES_PER_SLICE: usize = 4096;

pub(crate) struct SweepState {
    /// When the next slice is due.
    pub next_at: Instant,
    /// Where the current pass resumes in the `channels` space; `None` =
    /// start a new pass.
    cursor: Option<Bound<Vec<u8>>>,
}

impl SweepState {
    pub fn new(next_at: Instant) -> Self {
        Self { next_at, cursor: None }
    }
}

#[derive(Default)]
struct SliceOutcome {
    expired: u64,
    /// Of `expired`, messages some subscriber had not acked.
    unacked_expired: u64,
    receipts_expired: u64,
    /// The slice ran out of budget or the pass has channels left.
    more: bool,
}

impl Writer {
    /// Run one bounded slice of the sweep and schedule the next.
    pub(crate) fn sweep_step(&mut self) {
        if self.shared.failure().is_some() {
            self.sweep.next_at = Instant::now() + self.sweep_interval;
            return;
        }
        let mut ws = WriteSet::default();
        let result = self.sweep_slice(&mut ws).and_then(|outcome| {
            self.commit(ws, self.fsync == FsyncMode::Always)?;
            Ok(outcome)
        });
        match result {
            Ok(outcome) => {
                self.shared.counters.expired.add(outcome.expired);
                self.shared.counters.unacked_trimmed.add(outcome.unacked_expired);
                self.shared.counters.receipts_expired.add(outcome.receipts_expired);
                let wait = if outcome.more { std::time::Duration::ZERO } else { self.sweep_interval };
                self.sweep.next_at = Instant::now() + wait;
            }
            Err(e) => {
                self.channels.clear();
                self.cursors.reset();
                self.shared.fail(format!("retention sweep failed: {e}"));
                self.sweep.next_at = Instant::now() + self.sweep_interval;
            }
        }
    }

    fn sweep_slice(&mut self, ws: &mut WriteSet) -> Result<SliceOutcome, StorageError> {
        let now = self.shared.clock.now_ms();
        let mut out = SliceOutcome::default();
        let mut budget = DELETES_PER_SLICE;

        // Expired receipts: one range scan of the expiry index up to `now`.
        let mut expired_keys = Vec::new();
        let upper = Bound::Excluded(now.saturating_add(1).to_be_bytes().to_vec());
        self.shared.storage.scan(Space::IdemExp, (Bound::Unbounded, upper), |k, _| {
            expired_keys.push(k.to_vec());
            Ok(if expired_keys.len() >= budget { ControlFlow::Break(()) } else { ControlFlow::Continue(()) })
        })?;
        out.more |= expired_keys.len() >= budget;
        budget -= expired_keys.len();
        for exp_key in expired_keys {
            let (exp, dedup_key) = codec::split_idem_exp_key(&exp_key)?;
            // The receipt may have been replaced by a newer one (after it
            // expired); only the one this entry indexes goes.
            if let Some(v) = self.shared.storage.get(Space::Idem, dedup_key)? {
                if IdemRecord::decode(&v)?.expires_at == exp {
                    ws.delete(Space::Idem, dedup_key.to_vec());
                    out.receipts_expired += 1;
                }
            }
            ws.delete(Space::IdemExp, exp_key);
        }

        if budget == 0 {
            return Ok(out);
        }
        // Channels with an age limit, from the cursor on.
        let from = self.sweep.cursor.take().unwrap_or(Bound::Unbounded);
        let mut channels = Vec::new();
        self.shared.storage.scan(Space::Channels, (from, Bound::Unbounded), |k, v| {
            channels.push((k.to_vec(), ChannelMeta::decode(v)?));
            Ok(if channels.len() >= CHANNELS_PER_SLICE {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            })
        })?;
        let pass_unfinished = channels.len() >= CHANNELS_PER_SLICE;
        for (key, stored) in channels {
            let name = self
                .shared
                .storage
                .key_layout()
                .channel_of(&key)
                .ok()
                .and_then(|s| ChannelName::new(s).ok())
                .ok_or_else(|| {
                    StorageError::Corrupt(format!("bad channel key {:?}", String::from_utf8_lossy(&key)))
                })?;
            // A channel with an age limit (written with the meta whenever
            // it changes): its head from the cache or the log (the stored
            // one may lag, see `KeyLayout::lazy_head`).
            let meta = if stored.max_age.is_some() { *self.channel_meta(&name)? } else { stored };
            let removed = match meta.max_age {
                Some(age) if meta.first <= meta.head => {
                    let cutoff = now.saturating_sub(u64::try_from(age.as_millis()).unwrap_or(u64::MAX));
                    let removed = self.expire_prefix(&name, meta, cutoff, budget, ws)?;
                    if removed > 0 {
                        let last = meta.first + removed as u64 - 1;
                        out.unacked_expired +=
                            self.cursors.unacked_in(&self.shared.storage, &name, meta.first, last)?;
                    }
                    removed
                }
                _ => 0,
            };
            budget -= removed;
            out.expired += removed as u64;
            if budget == 0 {
                // This channel may have more to expire: resume at it.
                self.sweep.cursor = Some(Bound::Included(key));
                out.more = true;
                break;
            }
            self.sweep.cursor = Some(Bound::Excluded(key));
        }
        out.more |= pass_unfinished;
        if !out.more {
            self.sweep.cursor = None;
        }
        Ok(out)
    }

    /// Delete the entries of `channel` older than `cutoff` (at most `budget`)
    /// and advance `first` past them. Returns how many were deleted.
    fn expire_prefix(
        &mut self,
        channel: &ChannelName,
        meta: ChannelMeta,
        cutoff: u64,
        budget: usize,
        ws: &mut WriteSet,
    ) -> Result<usize, StorageError> {
        let name = channel.as_str();
        let layout = self.shared.storage.key_layout();
        let log = layout.log(name);
        let range = (Bound::Included(log.key(meta.first)), Bound::Included(log.key(meta.head)));
        let mut expired = 0u64;
        let mut expected = meta.first;
        self.shared.storage.scan(Space::Log, range, |k, v| {
            let seq = log.seq(k)?;
            if seq != expected {
                return Err(StorageError::Corrupt(format!(
                    "channel {name}: expected seq {expected}, found {seq}"
                )));
            }
            let (header, _) = codec::decode_log_value(v)?;
            if header.ts >= cutoff || expired as usize >= budget {
                return Ok(ControlFlow::Break(()));
            }
            expired += 1;
            expected += 1;
            Ok(ControlFlow::Continue(()))
        })?;
        if expired == 0 {
            return Ok(0);
        }
        for seq in meta.first..meta.first + expired {
            ws.delete_with(Space::Log, |k| log.push_key(k, seq));
        }
        let cached = self.channel_meta(channel)?;
        cached.first += expired;
        ws.put(Space::Channels, layout.channel_key(name), cached.encode());
        Ok(expired as usize)
    }
}
