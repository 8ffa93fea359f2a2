use std::path::PathBuf;

/// Why the embedded engine could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("data dir {} is in use by another Herald engine or process", path.display())]
    Locked { path: PathBuf },
    #[error("cannot create data dir {}: {source}", path.display())]
    CreateDir { path: PathBuf, source: std::io::Error },
    #[error("storage error: {0}")]
    Storage(String),
    #[error("data dir is corrupt or from an incompatible version: {0}")]
    Corrupt(String),
    #[error("invalid store config: {0}")]
    Config(String),
    #[error("cannot start the writer thread: {0}")]
    Spawn(std::io::Error),
}
