//! Engine configuration and its defaults.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::StoreError;

/// Appends committed together (one storage batch, one fsync) at most.
pub const DEFAULT_MAX_BATCH: usize = 512;
/// Appends queued for the writer before `append` waits for room.
pub const DEFAULT_QUEUE_CAPACITY: usize = 4096;
/// How often retention by age and receipt expiry run.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(30);
/// Longest an ack waits for an fsync under [`FsyncMode::Always`].
pub const DEFAULT_ACK_SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// When an append counts as durable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsyncMode {
    /// The reply waits for an fsync of the journal (shared by every append of
    /// one group commit). An acknowledged append survives a power loss.
    #[default]
    Always,
    /// The reply waits until the journal write reached the OS page cache: an
    /// acknowledged append survives a crash of Herald (`kill -9`) but may be
    /// lost, with every later append, if the machine loses power or the OS
    /// crashes. The OS writes dirty pages back on its own schedule.
    Never,
}

impl FromStr for FsyncMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "always" => Ok(Self::Always),
            "never" => Ok(Self::Never),
            other => Err(format!("unknown fsync mode `{other}` (expected `always` or `never`)")),
        }
    }
}

impl fmt::Display for FsyncMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Always => "always",
            Self::Never => "never",
        })
    }
}

/// What an operator sets of the embedded engine: the `[storage]` section
/// of `herald.toml` (the data dir is the top-level `data_dir`). The rest of
/// [`StoreConfig`] keeps its defaults in a deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSettings {
    /// `always`: a publish is answered after its batch is fsynced (default).
    /// `never`: answered after the write reaches the OS; a machine crash can
    /// lose the last moments of acknowledged publishes.
    pub fsync: FsyncMode,
    /// Most appends sharing one fsync (one group commit).
    pub max_appends_per_commit: usize,
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self { fsync: FsyncMode::default(), max_appends_per_commit: DEFAULT_MAX_BATCH }
    }
}

impl StoreSettings {
    /// Check the settings; the error is one line for the operator, naming
    /// the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_appends_per_commit == 0 {
            return Err("storage.max_appends_per_commit must be at least 1".into());
        }
        Ok(())
    }
}

/// Configuration of an [`EmbeddedEngine`](crate::EmbeddedEngine).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// Directory of the store; created if missing. One engine at a time.
    pub data_dir: PathBuf,
    pub fsync: FsyncMode,
    /// Appends per group commit at most (>= 1).
    pub max_batch: usize,
    /// Capacity of the writer's request queue (>= 1); a full queue makes
    /// `append` wait, which is the engine's backpressure.
    pub queue_capacity: usize,
    /// Interval of the retention-by-age and receipt-expiry sweep (> 0).
    pub sweep_interval: Duration,
    /// With [`FsyncMode::Always`], acks are committed without an fsync of
    /// their own (an `Ok` ack survives a crash of Herald) and fsynced at
    /// most this long after (so an OS crash or power loss loses at most
    /// this window of acks, which only causes redelivery). Sooner when an
    /// append batch fsyncs anyway. Ignored with [`FsyncMode::Never`] (> 0).
    pub ack_sync_interval: Duration,
}

impl StoreConfig {
    /// The defaults, with the given data dir.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            fsync: FsyncMode::default(),
            max_batch: DEFAULT_MAX_BATCH,
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
            ack_sync_interval: DEFAULT_ACK_SYNC_INTERVAL,
        }
    }

    /// The defaults, with the given data dir and an operator's settings.
    pub fn with_settings(data_dir: impl Into<PathBuf>, settings: &StoreSettings) -> Self {
        Self { fsync: settings.fsync, max_batch: settings.max_appends_per_commit, ..Self::new(data_dir) }
    }

    pub(crate) fn validate(&self) -> Result<(), StoreError> {
        let invalid = |m: &str| Err(StoreError::Config(m.to_owned()));
        if self.max_batch == 0 {
            return invalid("max_batch must be at least 1");
        }
        if self.queue_capacity == 0 || self.queue_capacity > tokio::sync::Semaphore::MAX_PERMITS {
            return invalid("queue_capacity must be at least 1 (and fit a tokio channel)");
        }
        if self.sweep_interval.is_zero() {
            return invalid("sweep_interval must be positive");
        }
        if self.ack_sync_interval.is_zero() {
            return invalid("ack_sync_interval must be positive");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_zeroes_are_not() {
        let c = StoreConfig::new("/tmp/x");
        assert!(c.validate().is_ok());
        assert_eq!(c.fsync, FsyncMode::Always);
        assert!(StoreConfig { max_batch: 0, ..c.clone() }.validate().is_err());
        assert!(StoreConfig { queue_capacity: 0, ..c.clone() }.validate().is_err());
        assert!(StoreConfig { sweep_interval: Duration::ZERO, ..c.clone() }.validate().is_err());
        assert!(StoreConfig { ack_sync_interval: Duration::ZERO, ..c }.validate().is_err());
        assert_eq!("never".parse::<FsyncMode>(), Ok(FsyncMode::Never));
        assert!("sometimes".parse::<FsyncMode>().is_err());
    }

    #[test]
    fn settings_fill_the_config_and_zero_batches_are_refused() {
        let s = StoreSettings { fsync: FsyncMode::Never, max_appends_per_commit: 8 };
        let c = StoreConfig::with_settings("/tmp/x", &s);
        assert_eq!((c.fsync, c.max_batch, c.queue_capacity), (FsyncMode::Never, 8, DEFAULT_QUEUE_CAPACITY));
        assert!(StoreSettings::default().validate().is_ok());
        assert_eq!(
            StoreConfig::with_settings("/tmp/x", &StoreSettings::default()),
            StoreConfig::new("/tmp/x")
        );
        let zero = StoreSettings { max_appends_per_commit: 0, ..s };
        assert_eq!(zero.validate(), Err("storage.max_appends_per_commit must be at least 1".to_owned()));
    }
}
