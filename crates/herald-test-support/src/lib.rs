//! Test harnesses for Herald's integration tests (a dev-dependency only):
//!
//! - [`TestServer`]: a real server in the test process on `127.0.0.1:0`,
//!   over the embedded engine in a temp dir, with HTTP helpers;
//! - [`Node`]: the same harness over a `RedisEngine`, so several nodes on
//!   one Redis are a multi-node deployment in one process, and
//!   [`CrashableNode`], one that dies the way a process does;
//! - reading a connection with a deadline ([`next_frame`], [`next_message`],
//!   [`read_until_closed`], ...);
//! - [`HeraldProcess`]: a `herald serve` process, to kill or freeze;
//! - [`SseStream`]: a Server-Sent Events reader for `GET /sse`;
//! - [`PostgresServer`]: a private PostgreSQL cluster (`initdb` +
//!   `pg_ctl` on a free port), for the outbox consumer's tests;
//! - connection tokens signed with the harness key ([`user_token`]);
//! - the history checker of the fault tests ([`history`]);
//! - re-exported from below: the one bounded wait ([`assert_eventually`],
//!   [`eventually`], [`WAIT`], from `herald_core::conformance`) and the
//!   `redis-server` launchers ([`RedisServer`], [`RedisCluster`],
//!   [`RedisProxy`], from `herald_redis::testing`).
//!
//! It sits above herald-server and herald-client and is a dev-dependency
//! only of crates above them: the engines' own tests use the lower
//! `herald_core::conformance` and `herald_redis::testing` directly, so no
//! crate depends on a crate above it, even for tests. Every wait is
//! bounded; nothing touches a shared Redis.

pub mod history;

mod frames;
mod node;
mod postgres;
mod process;
mod server;
mod sse;
mod tokens;

pub use frames::{
    assert_silent, create_room, data, join, keep_reading, next_event, next_frame, next_message,
    next_messages, next_presence, next_reply, next_room_event, read_until_closed, seqs,
};
pub use herald_core::conformance::{assert_eventually, eventually, WAIT};
pub use herald_redis::testing::{
    cli, engine_config, init_tracing, signal, RedisCluster, RedisProxy, RedisServer,
};
pub use node::{presence_config, CrashableNode, Node};
pub use postgres::{connect as postgres_connect, PostgresServer};
pub use process::HeraldProcess;
pub use server::{base_config, Resp, TestServer, API_KEY, API_KEY_2, JWT_SECRET};
pub use sse::{SseEvent, SseOpen, SseStream};
pub use tokens::{hs256_token, now_secs, user_token};
