//! The Redis Streams consumer.

use std::sync::Arc;

use super::Consumer;
use crate::state::AppState;

/// Refused by validation until built; nothing to run.
pub async fn run(_state: Arc<AppState>, _consumer: Arc<Consumer>) {}

/// Whether this build runs `redis-stream` consumers.
pub const BUILT: bool = false;
