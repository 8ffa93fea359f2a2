//! Herald's Redis engine: every channel's log in Redis (a single instance or
//! a Redis Cluster), behind the [`herald_core::Engine`] contract, with
//! fan-out between the Herald nodes that share it. See `docs/redis.md` for
//! the operator's view.
//!
//! This crate must never answer an append `Ok` that Redis did not confirm,
//! let a call wait on Redis longer than the command timeout, hand a fan-out
//! sink a channel's messages out of order or with a gap within an epoch, or
//! let a seq be trusted after Redis lost data (it starts a new epoch). It
//! knows nothing of sockets or HTTP.
//!
//! # How an append flows
//!
//! The node builds the frame once, with placeholders for the seq
//! and the timestamp (`frame.rs`), and a UUIDv7 id. With a dedup key it
//! first claims the key for the channel (`SET herald:idem:{key} channel NX
//! GET`): a key first used on another channel is a mismatch, as in the
//! embedded engine. Then one Lua script (`scripts/append.lua`, `APPEND`) on the
//! channel's slot, atomically: the dedup check (a hit returns the stored
//! receipt; another fingerprint is a mismatch), the channel's epoch (a
//! channel never seen gets a new one), `seq = head + 1`, `XADD` with id
//! `<seq>-0` and exact `MAXLEN` trimming, age trimming, the meta update,
//! the receipt with its TTL, and the fan-out `PUBLISH` (`SPUBLISH` on a
//! cluster). Arguments are validated before the first write. Volatile
//! appends (`durable: false`) get no seq and no log entry: only the
//! receipt, with a key, and the fan-out; a run of volatile appends
//! without a key goes through `scripts/volatile.lua` (`VOLATILE`), which
//! does the same with fewer arguments and less Lua. A batch (`Log::append_batch`)
//! claims its keys in one pipeline and runs `APPEND` with whole channels,
//! each channel's messages in order: on a single instance several channels
//! in a run, on a cluster one (a script's keys share a slot); the runs in
//! one pipeline (`append.rs`).
//!
//! # Scripts: arguments and replies
//!
//! Every script is a `.lua` file under `scripts/` whose header names its
//! `KEYS` and `ARGV` in order. It is run through one argument struct
//! (`scripts/args.rs`) whose fields are those keys and arguments, pushed in
//! the script's order (a unit test checks each header against its struct),
//! and its reply is read by one reader (`reply.rs`), which also turns a
//! malformed reply or an error reply into `EngineError::Unavailable`. The
//! engine's shared state is `EngineState` (`state.rs`).
//!
//! # Fan-out
//!
//! Published by the script, in seq order, received by the nodes that watch
//! the channel and made gap-free with the log: a
//! [`Feed`](herald_core::feed::Feed) per watched channel decides, `fanout.rs`
//! is the transport around it.
//!
//! # Epochs and lost data
//!
//! A channel's epoch lives in its meta hash. Redis can lose data: a restart
//! without persistence, `appendfsync everysec` after a crash, a failover to
//! a replica that had not received the tail. The engine starts a new epoch
//! when it can tell: the meta is gone while the log is not (the scripts),
//! or a watching node sees the head below, or the message at its last seq
//! different from, what it already handed out (`fanout.rs`). A channel
//! whose meta and log are both gone gets a new epoch at the next read or
//! append anyway. Clients resuming with the old epoch are told
//! `epoch_changed` and start again from `first`. Each detection is logged
//! and counted ([`RedisStats::data_loss_detected`]).
//!
//! # Acks and cursors
//!
//! A cursor is a field of the channel's cursor hash, changed by a
//! compare-and-raise script that refuses a seq beyond the head. The first
//! ack of a subscriber on a channel first adds `<subscriber key>\0<channel>`
//! to the user's index (another slot, so written before the cursor;
//! `user_cursors` skips entries without a cursor).
//!
//! # Presence and rooms
//!
//! A member's lease lives in its channel's slot, changed by one script per
//! operation with fencing tokens and expiries in Redis's time (`TIME`), so
//! leases expire on time whichever node wrote them. A global sweep index
//! lets any node's `presence_expire` find expired leases; it may be early,
//! never late, and the channel script decides what is removed, so each
//! lease is removed and returned once (`presence.rs`). Each removal is
//! remembered for a while (`presence:gone`), so a late rejoin loses. A room write is one
//! script: version compare-and-set, the event appended like any append,
//! and on close the closed flag (every later append is refused after the dedup
//! check) and the removal of the channel's leases (`rooms.rs`).
//!
//! # Failure
//!
//! Every call is bounded by the command timeout. A timeout or a connection
//! error marks Redis down: calls then fail at once with
//! [`EngineError::Unavailable`](herald_core::EngineError::Unavailable) and
//! [`health`](herald_core::Lifecycle::health) says so, until a probe (every
//! `head_check_interval`) gets an answer. A connection whose call timed
//! out is replaced by a freshly dialled one (`dial.rs`: a connection stuck
//! in TCP retransmission backoff would stay silent long after the network
//! healed), and every socket has TCP keepalive and `TCP_USER_TIMEOUT`; the
//! pub/sub connection resubscribes and the fan-out fills what it missed
//! from the log. An `Unavailable` append has
//! an unknown outcome (Redis may have run the script just before the
//! timeout); a retry with the same key settles it.
//!
//! # Key layout
//!
//! See `keys.rs` (and `docs/redis.md`): every key of channel `c` has the
//! hash tag `{c}`, and every key starts with the configured prefix.

mod append;
mod config;
mod conn;
mod control;
mod cursors;
mod dial;
mod engine;
mod error;
mod fanout;
mod frame;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod keys;
mod lease;
mod presence;
mod read;
mod reply;
mod rooms;
mod schedules;
mod scripts;
mod state;
mod stats;
#[cfg(feature = "test-util")]
pub mod testing;

pub use config::{
    RedisConfig, RedisSettings, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECTIONS, DEFAULT_FANOUT_QUEUE,
    DEFAULT_FILL_CONCURRENCY, DEFAULT_HEAD_CHECK_INTERVAL, DEFAULT_KEY_PREFIX, DEFAULT_LEASE_TTL,
    DEFAULT_URL,
};
pub use engine::RedisEngine;
pub use error::RedisError;
pub use stats::RedisStats;
