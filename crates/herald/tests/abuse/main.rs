//! Abuse tests (issue 10, "Hardening"): what one hostile client can do to a
//! real server through real sockets, and what it cannot. One binary, one
//! module per area.

#[path = "../common/mod.rs"]
mod common;

mod connections;
