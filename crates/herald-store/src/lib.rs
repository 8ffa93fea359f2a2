//! Herald's embedded engine: every channel's log on local disk, in the data
//! dir, behind the [`herald_core::Engine`] contract, with fan-out in process.
//! It serves one node; multi-node deployments use the Redis engine.
//!
//! This crate must never answer an append `Ok` before the append (and its
//! idempotency receipt) is durable under the configured [`FsyncMode`], let a
//! reader see a message whose append could still fail, append anything to a
//! closed channel, hand out a channel's fencing token twice, change a room
//! record without appending its event (or the reverse), or keep accepting
//! writes after a storage error (fail-stop). It knows nothing of sockets or
//! HTTP.
//!
//! # How an append flows
//!
//! `append` puts the request on a bounded queue (full queue: the caller
//! waits) and awaits a oneshot reply. One writer thread (`writer.rs`, the
//! batch loop) owns every mutation. Every kind of write (append, ack,
//! presence, room, schedule) is a request type that implements one
//! interface, `stage.rs`'s `Stage`, in its own module (an append: in
//! `append.rs`), and is one arm of the queue's `Request` (`request.rs`).
//! The writer takes all queued requests (up to
//! [`StoreConfig::max_batch`]) and stages each. For an append it checks
//! dedup (requests of the same batch first, then the `idem` space; an
//! expired receipt counts as absent), refuses it with [`EngineError::Closed`](herald_core::EngineError::Closed)
//! if the channel is closed (durable or volatile alike; a dedup hit still
//! gets its receipt), assigns `seq = head + 1`, a UUIDv7 id and a
//! timestamp, encodes the frame (of the request's `kind`) once, and stages
//! the log entry, the channel meta (with `closed` set by a closing append),
//! the `max_len` trimming and the receipt. The whole batch is one atomic storage
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
//! Every request of a batch is staged against the committed state overlaid
//! with what the batch staged before it, so a batch behaves as if its
//! requests had committed one by one, in queue order.
//!
//! # How an ack flows
//!
//! `ack` takes the same queue to the same writer, and is staged into the
//! same group commit as the appends around it (`cursors.rs`): it is refused
//! with [`AckError::BeyondHead`](herald_core::AckError::BeyondHead) if its
//! seq is past the channel's head (as this batch leaves it), else the
//! cursor becomes `max(stored, seq)` (an ack at or below the stored cursor
//! writes nothing). The writer is the only committer, so concurrent acks of
//! one cursor cannot lose an update and the cursor never goes backwards. The
//! caller is answered after the commit, with the resulting cursor.
//!
//! Acks never cost an fsync of their own. A batch that appended something is
//! fsynced anyway ([`FsyncMode::Always`]) and carries its acks along; a
//! batch of acks only is committed without fsync: its journal write reaches
//! the OS before the callers are answered, so an `Ok` ack survives a crash
//! of Herald (`kill -9`), and it is fsynced at most
//! [`StoreConfig::ack_sync_interval`] (default 1 s) later, by the next
//! append batch, sweep or the ack-sync timer. An OS crash or power loss can
//! therefore lose up to that window of acks (the journal is one ordered
//! file, so never an ack older than a surviving append): the cursors come
//! back lower, which means redelivery of messages already handled, never
//! loss. With [`FsyncMode::Never`] acks are fsynced only at a clean close,
//! like appends.
//!
//! # Presence
//!
//! `presence_join`, `presence_renew`, `presence_rejoin`, `presence_leave`
//! and `presence_expire` go through the writer like acks, and cost no fsync of
//! their own either: committed to the OS before the reply (an `Ok` survives
//! `kill -9`), fsynced within `ack_sync_interval` (see `presence.rs` for
//! why losing that window to a machine crash cannot break fencing on a
//! single node). A join takes the channel's next fencing token from
//! `presence_tokens` (never reset or deleted, so tokens grow across leaves,
//! sweeps, room closes and restarts) and is refused on a closed channel.
//! Renew and leave act only with the stored token. A rejoin re-creates a
//! removed lease with its holder's token unless a later token of the member
//! was removed since, or its holder left: the writer remembers removals in
//! memory (`gone.rs`; tokens live only in this process's sessions, so a
//! restart forgets nothing a holder could use). `presence_expire`
//! removes leases from the expiry index in expiry order, each in the same
//! commit as handing it to exactly one caller. Leases keep their
//! `expires_at_ms` across restarts, so those of a dead process expire on
//! time and are swept then. Reads (`presence`, `presence_count`,
//! `presence_has_user`) filter expired leases by the engine's clock, the
//! same clock the writer uses, so an expired lease disappears from them at
//! once, before any sweep.
//!
//! # Rooms
//!
//! `room_write` goes through the writer and its group commit like an
//! append, with the fsync (`rooms.rs`): compare-and-set on the record's
//! version, the event's append, the record and the `rooms_active` entry in
//! one commit, or nothing. A write to `closed` closes the channel in the
//! event's append, deletes every lease of the channel and the
//! `rooms_active` entry, in the same commit.
//!
//! Retention that removes messages above a channel's lowest cursor counts
//! them in [`StoreStats::unacked_trimmed`] (once per message; see
//! `cursors.rs` for the bound and its cost).
//!
//! Reads (`position`, `read`, cursors, presence, rooms) go straight to a
//! consistent storage snapshot, not through the writer. Storage makes a
//! commit visible only after it is durable, so no clamp to a "durable head"
//! is needed: a reader can never see a message that a failed fsync would
//! take back.
//!
//! # Durability and failure
//!
//! - [`FsyncMode::Always`] (default): an `Ok` append survives power loss.
//! - [`FsyncMode::Never`]: an `Ok` append survives a Herald crash
//!   (`kill -9`), not an OS crash or power loss.
//! - Any storage error (commit, fsync, read, corruption) puts the engine into
//!   fail-stop: the requests of the failing batch and every later append get
//!   [`EngineError::Failed`](herald_core::EngineError::Failed) and
//!   [`health`](herald_core::Lifecycle::health) reports
//!   [`Health::Failed`](herald_core::Health::Failed) until restart. An append
//!   answered `Failed` has an unknown outcome: its journal write may or may
//!   not be recovered after the restart (as with any database after a failed
//!   fsync); if it is, it is whole and in order, and its receipt makes a
//!   retry with the same key a duplicate.
//! - After a crash, reopening recovers every channel's head and first from
//!   the `channels` space, which is committed in the same atomic batch as
//!   the log entries it describes.
//! - Acks: see "How an ack flows" above. A cursor never exceeds its
//!   channel's head, also after a crash (the ack and the append it
//!   acknowledges are in journal order).
//! - Presence writes: like acks (see "Presence" above). Room writes: like
//!   appends.
//! - A closed channel stays closed: `closed` is in the channel meta,
//!   committed with the closing append, and nothing clears it.
//!
//! # On-disk layout (fjall keyspaces; integers big-endian)
//!
//! Fifteen keyspaces. `++` is concatenation; `channel` is the channel name's
//! bytes; a value's leading `format` is one byte (`1` unless said), and an
//! unknown one is corruption, never guessed at. Only `log` and `channels`
//! have per-format key layouts (see below); every other key is the same in
//! both formats.
//!
//! | keyspace | key | value |
//! |---|---|---|
//! | `meta` | `format` | store format: `2` for a data dir made by this version, `1` for one made by an earlier one (read and written in its own layout) |
//! | `meta` | `epoch` | UUID made when the data dir was created; every channel's [`Epoch`](herald_core::Epoch) |
//! | `log` | format 2: tag ++ channel ++ `0x00` ++ seq (u64); format 1: channel ++ `0x00` ++ seq | format ++ ts (u64 ms) ++ id (16-byte UUIDv7) ++ the `message` frame, byte for byte as sent |
//! | `channels` | format 2: tag ++ channel; format 1: channel | format (`2`) ++ head (u64) ++ first (u64) ++ has_max_age (u8) ++ max_age_ms (u64) ++ closed (u8); format `1` (still read) has no `closed` |
//! | `idem` | dedup key | format ++ fingerprint (32) ++ has_seq (u8) ++ seq (u64) ++ id (16) ++ ts (u64) ++ expires_at (u64 ms) ++ channel (u16 len + bytes) ++ epoch (u16 len + bytes); a schedule's receipt has no seq, its schedule's id, `ts = deliver_at` and the epoch `schedule` |
//! | `idem_exp` | expires_at (u64 ms) ++ dedup key | empty: the expiry index the sweeper scans |
//! | `cursors` | channel ++ `0x00` ++ subscriber key | format ++ seq (u64) ++ acked_at_ms (u64) |
//! | `user_cursors` | subscriber key ++ `0x00` ++ channel | empty: the per-user index of `cursors` |
//! | `presence` | channel ++ `0x00` ++ member key | format ++ token (u64) ++ expires_at_ms (u64) ++ the member as JSON |
//! | `presence_exp` | expires_at_ms (u64) ++ channel ++ `0x00` ++ member key | empty: the lease expiry index `presence_expire` scans |
//! | `presence_tokens` | channel | format ++ the last fencing token handed out (u64) |
//! | `rooms` | channel | format ++ the [`Room`](herald_core::Room) record as JSON |
//! | `rooms_active` | channel | empty: the index of rooms not closed |
//! | `schedules` | schedule id (the hyphenated UUIDv7, as text) | the record of [`Schedule::encode_record`](herald_core::Schedule::encode_record), JSON `{"c": channel, "t": deliver_at, "r": created_at, "d": data, "m": meta}` with `data` byte for byte (no format byte: the layout both engines store) |
//! | `schedules_due` | deliver_at (u64 ms) ++ schedule id | empty: the global due index, in delivery order |
//! | `schedules_by_channel` | channel ++ `0x00` ++ deliver_at (u64 ms) ++ schedule id | empty: the per-channel index of `schedules` |
//! | `control` | `ban\0` ++ user key ++ `\0` ++ device (empty: every device), or `rev\0` ++ user key (user key: `{len}:{user}`) | until / issued-before, ms (u64 BE): bans and revocations (`control.rs`) |
//!
//! The id and ts sit in a fixed header before the frame so reads and the
//! sweeper never parse JSON, and reads send the stored frame unchanged.
//! Channel names never contain `0x00`, so each channel's log is one
//! contiguous key range, and so are its cursors, leases and schedules. The
//! tag of a format-2 log or channel key is the first four bytes of the
//! channel name's XXH3-64 (`codec::channel_tag`): the memtable compares
//! keys by their first four bytes first, and without the tag those would
//! be the namespace, the same for every key (`chat`), so every comparison
//! of an insert would read the whole key. A channel's keys share its tag,
//! so its range stays contiguous and in seq order. The subscriber key is
//! [`SubscriberId::key`](herald_core::SubscriberId::key) (length-prefixed
//! user and device, no control characters), so a user's `user_cursors`
//! entries, every device and channel, are the one key range starting with
//! [`SubscriberId::user_prefix`](herald_core::SubscriberId::user_prefix).
//! An index entry is written in the same commit as its cursor's first ack;
//! cursors are never deleted. The cursor, presence, room and schedule
//! keyspaces are not part of the store format: a data dir without them
//! opens with them empty.
//!
//! For a channel `c`, the log holds exactly the seqs `first..=head` of its
//! meta; a channel never written has `head = 0`, `first = 1`; once `closed`,
//! `head` never moves again. In format 1 the meta is written with every
//! commit that appends to the channel. In format 2 it is written only when
//! `first`, `max_age` or `closed` change (the first append with a history
//! age limit, a trim, an age expiry, the close), in the same commit as the
//! log change: its stored `head` may lag, and the head is the greater of it
//! and the seq of the channel's last log entry (one reverse seek when the
//! writer first touches the channel and on each read). This spares an
//! append the memtable insert of its meta (with each append to a channel
//! of its own, half of the append's inserts). The lagging head is part
//! of format 2: every binary that opens a format-2 data dir reads the head
//! from the log.
//!
//! The member key is [`member_key`](herald_core::member_key)
//! (`{len(user)}:{user}{client_id}`), so a channel's leases are one key
//! range and a user's leases on it one prefix range
//! (`channel ++ 0x00 ++ {len(user)}:{user}`). Every lease has exactly one
//! `presence_exp` entry, at its current expiry: each change of a lease's
//! expiry or its removal moves or removes the entry in the same commit.
//! `presence_tokens` holds, per channel, a token at least as high as every
//! lease's token of that channel; it is never deleted. A `rooms_active`
//! entry exists exactly for each `rooms` record not in state `closed`. A
//! schedule has exactly one entry in each of `schedules_due` and
//! `schedules_by_channel`, at its `deliver_at`, written and removed in the
//! same commit as its record; schedule ids are UUIDv7, so `schedules_due`
//! orders schedules of one `deliver_at` by creation.
//!
//! Storage access is confined to `storage.rs` (fjall today) so another
//! embedded store could replace it; the properties it must keep are listed
//! there.

mod append;
mod codec;
mod config;
mod control;
mod cursors;
mod engine;
mod error;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod gone;
mod presence;
mod read;
mod request;
mod rooms;
mod schedules;
mod shared;
mod stage;
mod stats;
mod storage;
mod sweep;
mod writer;

pub use config::{
    FsyncMode, StoreConfig, StoreSettings, DEFAULT_ACK_SYNC_INTERVAL, DEFAULT_MAX_BATCH,
    DEFAULT_QUEUE_CAPACITY, DEFAULT_SWEEP_INTERVAL,
};
pub use engine::EmbeddedEngine;
pub use error::StoreError;
pub use stats::StoreStats;
