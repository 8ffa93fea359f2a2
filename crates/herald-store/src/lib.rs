//! Herald's embedded engine: every channel's log on local disk, in the data
//! dir, behind the [`herald_core::Engine`] contract, with fan-out in process.
//! It serves one node; multi-node deployments use the Redis engine.
//!
//! This crate must never answer an append `Ok` before the append (and its
//! idempotency receipt) is durable under the configured [`FsyncMode`], let a
//! reader see a message whose append could still fail, or keep accepting
//! writes after a storage error (fail-stop). It knows nothing of sockets or
//! HTTP.
//!
//! # How an append flows
//!
//! `append` puts the request on a bounded queue (full queue: the caller
//! waits) and awaits a oneshot reply. One writer thread (`writer.rs`) owns
//! every mutation: it takes all queued requests (up to
//! [`StoreConfig::max_batch`]), and for each one checks dedup (requests of
//! the same batch first, then the `idem` space; an expired receipt counts as
//! absent), assigns `seq = head + 1`, a UUIDv7 id and a timestamp, encodes
//! the `message` frame once, and stages the log entry, the channel meta, the
//! `max_len` trimming and the receipt. The whole batch is one atomic storage
//! commit with one fsync ([`FsyncMode::Always`]). Only then are the callers
//! answered, and then the new messages are handed to the
//! [`FanoutSink`](herald_core::FanoutSink)
//! (per channel in seq order; never duplicates). Volatile appends
//! (`durable: false`) get no seq and no log entry, only a receipt when they
//! carry a dedup key, and are fanned out the same way.
//!
//! Between batches the writer runs the retention sweep (`sweep.rs`) in
//! bounded slices: it removes messages older than their channel's `max_age`
//! and expired receipts.
//!
//! Reads (`position`, `read`) go straight to a consistent storage snapshot,
//! not through the writer. Storage makes a commit visible only after it is
//! durable, so no clamp to a "durable head" is needed: a reader can never see
//! a message that a failed fsync would take back.
//!
//! # Durability and failure
//!
//! - [`FsyncMode::Always`] (default): an `Ok` append survives power loss.
//! - [`FsyncMode::Never`]: an `Ok` append survives a Herald crash
//!   (`kill -9`), not an OS crash or power loss.
//! - Any storage error (commit, fsync, read, corruption) puts the engine into
//!   fail-stop: the requests of the failing batch and every later append get
//!   [`EngineError::Failed`](herald_core::EngineError::Failed) and
//!   [`health`](herald_core::Engine::health) reports
//!   [`Health::Failed`](herald_core::Health::Failed) until restart. An append
//!   answered `Failed` has an unknown outcome: its journal write may or may
//!   not be recovered after the restart (as with any database after a failed
//!   fsync); if it is, it is whole and in order, and its receipt makes a
//!   retry with the same key a duplicate.
//! - After a crash, reopening recovers every channel's head and first from
//!   the `channels` space, which is committed in the same atomic batch as
//!   the log entries it describes.
//!
//! # On-disk layout (fjall keyspaces; integers big-endian)
//!
//! | keyspace | key | value |
//! |---|---|---|
//! | `meta` | `format` | store format, `1` |
//! | `meta` | `epoch` | UUID made when the data dir was created; every channel's [`Epoch`](herald_core::Epoch) |
//! | `log` | channel ++ `0x00` ++ seq (u64) | format (u8) ++ ts (u64 ms) ++ id (16-byte UUIDv7) ++ the `message` frame, byte for byte as sent |
//! | `channels` | channel | format ++ head ++ first ++ has_max_age (u8) ++ max_age_ms |
//! | `idem` | dedup key | format ++ fingerprint (32) ++ has_seq (u8) ++ seq ++ id (16) ++ ts ++ expires_at ++ channel (u16 len + bytes) ++ epoch (u16 len + bytes) |
//! | `idem_exp` | expires_at (u64 ms) ++ dedup key | empty: the expiry index the sweeper scans |
//!
//! The id and ts sit in a fixed header before the frame so reads and the
//! sweeper never parse JSON, and reads send the stored frame unchanged.
//! Channel names never contain `0x00`, so each channel's log is one
//! contiguous key range. For a channel `c`, the log holds exactly the seqs
//! `first..=head` of its meta; a channel never written has `head = 0`,
//! `first = 1`.
//!
//! Storage access is confined to `storage.rs` (fjall today) so another
//! embedded store could replace it; the properties it must keep are listed
//! there.

mod codec;
mod config;
mod engine;
mod error;
mod read;
mod shared;
mod stats;
mod storage;
mod sweep;
mod writer;

pub use config::{FsyncMode, StoreConfig, DEFAULT_MAX_BATCH, DEFAULT_QUEUE_CAPACITY, DEFAULT_SWEEP_INTERVAL};
pub use engine::EmbeddedEngine;
pub use error::StoreError;
pub use stats::StoreStats;
