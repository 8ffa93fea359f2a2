//! The server's shared state: [`AppState`], held by `Arc` by every
//! handler, session and background task. It sits at the bottom of the
//! crate's layers, and names four types of the parts above it: the
//! shared state of the webhooks, of the outbox consumers, of the subscribe
//! proxy's cache and of the scheduler's wake-up, which it holds for them.

use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

use herald_core::Engine;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::{auth, browser, hub, metrics, publish};

/// Shared server state. Sessions and handlers hold it by `Arc`.
pub struct AppState {
    /// The configuration in force ([`AppState::config`]).
    pub(crate) live: arc_swap::ArcSwap<&'static Config>,
    pub engine: Arc<dyn Engine>,
    pub hub: Arc<hub::Hub>,
    pub metrics: Arc<metrics::Metrics>,
    /// Rebuilt from the configuration and swapped in on a reload
    /// (`reload`); a request or an upgrade loads the current one.
    pub(crate) jwt: arc_swap::ArcSwap<auth::JwtVerifier>,
    /// Likewise.
    pub(crate) api_keys: arc_swap::ArcSwap<auth::ApiKeys>,
    /// Live reloads: how to read the configuration again, and what the
    /// last reload applied (`crate::reload`).
    pub(crate) reloads: crate::reload::Reloads,
    pub(crate) in_flight: publish::InFlight,
    /// Cancelled when shutdown starts.
    pub shutdown: CancellationToken,
    /// Every socket session: shutdown tells each one through it
    /// (`hub::Sessions`), not through `shutdown`.
    pub sessions: hub::Sessions,
    /// The backend's orders to this node's sessions, and this node's id
    /// (`control.rs`).
    pub control: Arc<crate::control::Orders>,
    /// WebSocket tasks (axum/hyper do not track upgraded connections).
    pub(crate) tasks: TaskTracker,
    pub(crate) open_connections: AtomicUsize,
    /// Effective WebSocket connection cap (config, lowered to fit the
    /// open-files limit).
    pub max_connections: usize,
    /// Effective cap on connections that are not WebSocket sessions.
    pub max_http_connections: usize,
    /// `allowed_origins`, parsed.
    pub(crate) ws_origins: browser::Origins,
    /// `cors_origins`, parsed.
    pub(crate) cors_origins: browser::Origins,
    pub(crate) next_conn_id: AtomicU64,
    /// Heartbeat period of a connection holding presence leases: pings,
    /// idle and token checks, and lease renewals (at most a third of the
    /// lease TTL). Other connections tick every `heartbeat.ping_interval`.
    pub presence_tick: Duration,
    /// Wakes the scheduler for an earlier schedule.
    pub(crate) scheduler: crate::jobs::scheduler::Wake,
    /// The configured webhooks and their deliverers' shared state.
    pub webhooks: crate::integration::webhooks::Webhooks,
    /// The configured outbox consumers and what their partitions report.
    pub consumers: crate::integration::consumers::Consumers,
    /// Answers of the subscribe proxy, when cached.
    pub subscribe_cache: crate::integration::proxies::SubscribeCache,
}

impl AppState {
    /// The configuration in force now: the one started with, replaced as
    /// a whole by each applied reload (`reload`). Every setting is read
    /// from it where it is used; the keys a reload may not change
    /// (`reload::is_live`) are the same in every snapshot. A caller reads
    /// one snapshot per request or step.
    ///
    /// Each snapshot lives as long as the process (it is leaked when it is
    /// put in force, a few KiB per applied reload), so a reference to it
    /// may be held across awaits and reads cost one atomic load.
    pub fn config(&self) -> &'static Config {
        **self.live.load()
    }

    /// Put `config` in force (start and `reload` only).
    pub(crate) fn set_config(&self, config: Config) {
        self.live.store(Arc::new(Box::leak(Box::new(config))));
    }

    /// The initial value of [`AppState`]'s configuration.
    pub(crate) fn initial_config(config: Config) -> arc_swap::ArcSwap<&'static Config> {
        arc_swap::ArcSwap::from_pointee(Box::leak(Box::new(config)))
    }
}
