//! Helpers shared by the embedded engine's integration tests.
#![allow(dead_code)] // each test file uses a subset

use std::path::Path;
use std::time::Duration;

use herald_core::{AppendRequest, Dedup, Retention};
use herald_proto::ChannelName;
use herald_store::{EmbeddedEngine, StoreConfig};
use serde_json::value::RawValue;

pub fn open(dir: &Path, tweak: impl FnOnce(&mut StoreConfig)) -> EmbeddedEngine {
    let mut config = StoreConfig::new(dir);
    tweak(&mut config);
    EmbeddedEngine::open(config).expect("open engine")
}

pub fn channel(name: &str) -> ChannelName {
    ChannelName::new(name).expect("valid channel name")
}

pub fn req(channel: &ChannelName, data: &str) -> AppendRequest {
    AppendRequest::message(
        channel.clone(),
        RawValue::from_string(data.to_owned()).expect("valid JSON"),
        true,
        Retention { max_len: 0, max_age: None },
    )
}

pub fn dedup(key: &str, ttl: Duration) -> Dedup {
    Dedup { key: key.into(), fingerprint: [1; 32], ttl }
}
