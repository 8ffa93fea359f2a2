//! Abuse tests (issue 10): hostile input, limits and connection abuse
//! against a real server. One binary, one module per area.

#[path = "../common/mod.rs"]
mod common;

mod input;
