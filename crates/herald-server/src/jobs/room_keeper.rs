//! The room keeper: sweeps expired presence leases and drives room timers.
//!
//! - every `presence.sweep_interval` it removes expired leases (each is
//!   returned to exactly one sweeper, on any node) and announces their
//!   `leave`;
//! - it then walks the rooms that are not closed and applies the transition
//!   [`Room::due`](herald_core::Room::due) says (host present → `live`,
//!   host gone → `grace`, grace over → `closed`).
//!
//! The keeper reads everything from the engine, so nothing is lost with a
//! process: after a restart (or on another node) rooms whose host never came
//! back still close on time, because the host's lease and the grace deadline
//! are stored. Event-driven checks (a host joins or leaves) only make the
//! same transitions sooner.

use std::sync::Arc;
use std::time::Duration;

use herald_core::{EngineError, Lease};
use herald_proto::{ChannelName, FrameKind};

use crate::rooms::{announce, check_room, member_changed};
use crate::state::AppState;

/// Rooms read per keeper step.
const ROOM_PAGE: usize = 256;
/// Expired leases removed per sweep step.
const EXPIRE_PAGE: usize = 1024;

/// The keeper: sweeps expired leases and drives room timers until shutdown.
/// Every node runs one; the engine makes their work disjoint (a lease is
/// swept once, a room version is written once).
pub async fn run(state: Arc<AppState>) {
    let mut tick = tokio::time::interval(state.config().presence.sweep_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Logged once per outage, not on every tick.
    let mut failing = false;
    loop {
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        // Read each tick: a reload may add the first presence namespace.
        if !state.config().namespaces.0.values().any(|ns| ns.presence) {
            continue;
        }
        let result = match sweep_leases(&state).await {
            Ok(()) => sweep_rooms(&state).await,
            Err(e) => Err(e),
        };
        match result {
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "presence and room sweeps failing; retrying every sweep_interval");
            }
            Err(e) => tracing::debug!(error = %e, "presence and room sweeps still failing"),
            Ok(()) if failing => {
                failing = false;
                tracing::info!("presence and room sweeps recovered");
            }
            Ok(()) => {}
        }
    }
}

async fn sweep_leases(state: &Arc<AppState>) -> Result<(), EngineError> {
    // Bounded: a backlog larger than this waits for the next tick.
    for _ in 0..16 {
        let expired = state.engine.presence_expire(EXPIRE_PAGE).await?;
        let n = expired.len();
        for (channel, lease) in expired {
            expired_lease(state, &channel, &lease).await;
        }
        if n < EXPIRE_PAGE {
            break;
        }
    }
    Ok(())
}

async fn expired_lease(state: &Arc<AppState>, channel: &ChannelName, lease: &Lease) {
    state.metrics.presence_expired.inc();
    tracing::debug!(channel = %channel, "presence lease expired");
    announce(state, channel, FrameKind::Leave, &lease.member).await;
    member_changed(state, channel, &lease.member.user).await;
}

async fn sweep_rooms(state: &Arc<AppState>) -> Result<(), EngineError> {
    let mut after: Option<ChannelName> = None;
    loop {
        let page = state.engine.rooms_active(after.as_ref(), ROOM_PAGE).await?;
        let n = page.len();
        for (channel, _room) in page {
            check_room(state, &channel).await;
            after = Some(channel);
        }
        if n < ROOM_PAGE || state.shutdown.is_cancelled() {
            return Ok(());
        }
        // Let sessions run between pages of a long sweep.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
