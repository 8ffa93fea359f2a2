//! Abuse tests: what a hostile or broken client can make the server do, run
//! against a real server through real sockets. One binary, one module per
//! area (see docs/security.md).

#[path = "../common/mod.rs"]
mod common;

mod session;
