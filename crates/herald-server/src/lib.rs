//! Herald's network side: the listener, the WebSocket gateway and sessions,
//! the HTTP API, the hub, metrics and graceful shutdown.
//!
//! This crate drives an [`Engine`] and never touches storage itself: every
//! durable or cross-node effect goes through the engine, and fan-out comes
//! back from it into the [`hub::Hub`]. It must never block a runtime thread,
//! await a slow peer while holding shared state, or queue without a bound.
//!
//! # Layout
//!
//! The parts, bottom first; a module names only modules of its own part
//! or of a layer below (`scripts/check-server-layers` counts the
//! references that do not, and must find none):
//!
//! 1. The shared ground: [`state`](AppState) (the state every handler,
//!    session and job holds), `publish` (the one publish path), `rooms`
//!    (presence and room transitions), [`hub`] (fan-out, the mailboxes,
//!    the byte ceiling, the session registry), `control` (the backend's
//!    orders to sessions on every node, the node registry's report), and
//!    `config`, `error`,
//!    [`metrics`], [`auth`], [`browser`], [`reload`] (live configuration
//!    changes), [`trace`] (trace spans' target and W3C trace context).
//!    These may name each other.
//! 2. `integration` (webhooks, outbox consumers, backend proxies) and `jobs` (the
//!    scheduler, the room keeper): the work done beside requests.
//! 3. `api` (the HTTP API, a module per resource) and `gateway` (the
//!    listener, the WebSocket upgrades and the sessions): the two ways in.
//!    Neither names the other.
//! 4. This file: [`Server`], which binds, builds the router from the
//!    handlers and runs the listener and the jobs until shutdown.
//!
//! One exception: `AppState` holds the shared state of four parts above
//! it (the webhooks, the outbox consumers, the subscribe proxy's cache, the
//! scheduler's wake-up) and so names those four types.

mod api;
pub mod auth;
pub mod browser;
pub mod config;
mod control;
mod error;
mod gateway;
pub mod hub;
mod integration;
mod jobs;
pub mod metrics;
mod publish;
pub mod reload;
mod rooms;
mod state;
pub mod trace;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

use axum::http::header;
use axum::routing::{get, post};
use axum::Router;
use herald_core::Engine;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower_http::set_header::SetResponseHeader;

pub use config::Config;
pub use error::ApiError;
pub use integration::{consumers, proxies, webhooks};
pub use state::AppState;

/// Raise the soft open-files limit to the hard one and return the
/// (WebSocket, HTTP) connection caps that keep us clear of EMFILE: a reserve
/// for storage, logs and the listener (5% of the limit, at least 256), the
/// HTTP cap at most half of the rest, and the WebSocket cap within what is
/// left. Every accepted socket counts against one of the two caps.
pub fn fit_connection_caps(ws: usize, http: usize) -> (usize, usize) {
    let limit = rlimit::increase_nofile_limit(u64::MAX).unwrap_or(1024) as usize;
    fit_caps(limit, ws, http)
}

fn fit_caps(limit: usize, ws: usize, http: usize) -> (usize, usize) {
    let reserve = (limit / 20).max(256);
    let available = limit.saturating_sub(reserve).max(2);
    let http = http.min(available / 2).max(1);
    (ws.min(available - http).max(1), http)
}

pub struct Server {
    state: Arc<AppState>,
    listener: TcpListener,
}

impl Server {
    /// Bind the listener and wire the engine's fan-out into the hub.
    pub async fn bind(config: Config, engine: Arc<dyn Engine>) -> std::io::Result<Server> {
        let listener = TcpListener::bind(config.listen).await?;
        let metrics = Arc::new(metrics::Metrics::with_engine(&engine));
        let hub = Arc::new(hub::Hub::new(metrics.clone(), &config.websocket));
        engine.set_sink(hub.clone());
        let control = Arc::new(control::Orders::new(format!(
            "herald-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        )));
        engine.set_control_sink(control.clone());
        let jwt = auth::verifier(&config.jwt, None, &metrics)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let presence_tick = config.heartbeat.ping_interval.min(config.presence.renew_interval());
        let origins = |key: &str, list: &[String]| {
            browser::Origins::parse(list)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{key}: {e}")))
        };
        let ws_origins = origins("allowed_origins", &config.allowed_origins)?;
        let cors_origins = origins("cors_origins", &config.cors_origins)?;
        let (max_connections, max_http_connections) =
            fit_connection_caps(config.websocket.max_connections, config.http.max_connections);
        let state = Arc::new(AppState {
            presence_tick,
            max_connections,
            max_http_connections,
            ws_origins,
            cors_origins,
            api_keys: arc_swap::ArcSwap::from_pointee(auth::ApiKeys::new(&config.api_keys)),
            reloads: Default::default(),
            webhooks: webhooks::Webhooks::new(&config.webhooks),
            consumers: consumers::Consumers::new(&config.consumers),
            subscribe_cache: Default::default(),
            live: AppState::initial_config(config),
            engine,
            hub,
            metrics,
            jwt: arc_swap::ArcSwap::from_pointee(jwt),
            in_flight: publish::InFlight::default(),
            shutdown: CancellationToken::new(),
            sessions: hub::Sessions::default(),
            control,
            tasks: TaskTracker::new(),
            open_connections: AtomicUsize::new(0),
            next_conn_id: AtomicU64::new(1),
            scheduler: jobs::scheduler::Wake::default(),
        });
        state.control.attach(&state);
        Ok(Server { state, listener })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound listener has an address")
    }

    pub fn state(&self) -> &Arc<AppState> {
        &self.state
    }

    /// How a reload (SIGHUP, `POST /api/v1/admin/reload`) reads the
    /// configuration again: the way the binary read it at start.
    pub fn set_reloader(&self, read: reload::Reader) {
        let _ = self.state.reloads.reader.set(read);
    }

    /// How a reload that changes `log` puts the new filter in force.
    pub fn set_log_filter(&self, apply: reload::LogFilter) {
        let _ = self.state.reloads.log_filter.set(apply);
    }

    /// The router inside the layers every request passes, applied around
    /// it once: `Router::layer` would wrap every route on its own, and
    /// axum then clones each route's boxed layer stack for every request
    /// (an allocation per layer and route call).
    fn http_service(&self) -> gateway::listener::HttpService {
        let guarded = gateway::listener::body::Guard::new(self.router(), self.state.clone());
        let nosniff =
            SetResponseHeader::overriding(guarded, header::X_CONTENT_TYPE_OPTIONS, browser::NOSNIFF);
        SetResponseHeader::if_not_present(nosniff, header::CACHE_CONTROL, browser::NO_STORE)
    }

    fn router(&self) -> Router {
        // The 405 fallback is set before the CORS layer so that preflights
        // (OPTIONS) reach the layer.
        let api = Router::new()
            .route(
                "/api/v1/channels/{channel}/messages",
                post(api::messages::publish_one).get(api::messages::history),
            )
            .route("/api/v1/publish", post(api::messages::publish_batch))
            .route("/api/v1/messages", post(api::batch::publish_messages))
            .route("/api/v1/channels/{channel}/cursors", get(api::cursors::cursors))
            .route("/api/v1/users/{user}/inbox", get(api::cursors::inbox))
            .route("/api/v1/channels/{channel}/presence", get(api::rooms::presence))
            .route(
                "/api/v1/rooms/{room}",
                get(api::rooms::get_room)
                    .put(api::rooms::create_room)
                    .patch(api::rooms::patch_room)
                    .delete(api::rooms::delete_room),
            )
            .route("/api/v1/rooms/{room}/members/{user}", axum::routing::delete(api::users::remove_member))
            .route("/api/v1/users/{user}/connections", get(api::users::connections))
            .route("/api/v1/users/{user}/disconnect", post(api::users::disconnect))
            .route("/api/v1/users/{user}/revoke", post(api::users::revoke))
            .route("/api/v1/users/{user}/subscriptions", post(api::users::subscribe))
            .route(
                "/api/v1/users/{user}/subscriptions/{channel}",
                axum::routing::delete(api::users::unsubscribe),
            )
            .route("/api/v1/channels", get(api::nodes::channels))
            .route("/api/v1/nodes", get(api::nodes::nodes))
            .route("/api/v1/scheduled", get(api::scheduled::list))
            .route("/api/v1/admin/drain", post(api::admin::drain))
            .route("/api/v1/admin/reload", post(api::admin::reload))
            .route("/api/v1/scheduled/{id}", axum::routing::delete(api::scheduled::cancel))
            .route("/api/v1/consumers", get(api::consumers::status))
            .route("/api/v1/consumers/{name}/parked", get(api::consumers::parked))
            .route("/api/v1/consumers/{name}/parked/{id}/retry", post(api::consumers::retry))
            .route("/api/v1/webhooks", get(api::webhooks::status))
            .route("/api/v1/webhooks/{name}/channels/{channel}/skip", post(api::webhooks::skip))
            .route("/api/v1/webhooks/{name}/channels/{channel}/retry", post(api::webhooks::retry))
            .method_not_allowed_fallback(api::health::method_not_allowed);
        let api = match browser::cors_layer(&self.state.cors_origins) {
            Some(cors) => api.layer(cors),
            None => api,
        };
        Router::new()
            .route("/ws", get(gateway::ws::upgrade))
            .route("/sse", get(gateway::sse::stream))
            .route("/connection/websocket", get(gateway::centrifugo::upgrade))
            .merge(api)
            .route("/healthz", get(api::health::healthz))
            .route("/readyz", get(api::health::readyz))
            .route("/metrics", get(api::health::metrics))
            .merge(api::console::router())
            .fallback(api::health::not_found)
            .method_not_allowed_fallback(api::health::method_not_allowed)
            .with_state(self.state.clone())
    }

    /// Serve until `signal` resolves, then shut down gracefully: drain (the
    /// node says it is not ready and closes its WebSockets one by one over
    /// `shutdown.drain_period`, still serving), stop accepting, close what
    /// is left with 1001, let HTTP requests finish, wait up to the grace
    /// period, and close the engine (flush). [`hub::Sessions::hurry`] cuts
    /// the drain short.
    pub async fn run(self, signal: impl Future<Output = ()>) -> std::io::Result<()> {
        let state = self.state.clone();
        let http_tasks = TaskTracker::new();
        let http = &state.config().http;
        let serving = gateway::listener::Serving {
            connections: Arc::new(gateway::listener::Connections::new(
                state.max_http_connections,
                state.metrics.clone(),
            )),
            http: gateway::listener::Serving::http_builder(http),
            http2: gateway::listener::Serving::http2_builder(http),
            service: self.http_service(),
            timeouts: gateway::listener::Timeouts::from_config(http),
            shutdown: state.shutdown.clone(),
            metrics: state.metrics.clone(),
            tasks: http_tasks.clone(),
        };
        let keeper = tokio::spawn(jobs::room_keeper::run(state.clone()));
        let scheduler = tokio::spawn(jobs::scheduler::run(state.clone()));
        let deliverer = tokio::spawn(integration::webhooks::run(state.clone()));
        let consumers = tokio::spawn(integration::consumers::run(state.clone()));
        let reporter = tokio::spawn(control::report_node(state.clone()));
        tokio::pin!(signal);
        let mut signalled = false;
        loop {
            tokio::select! {
                () = &mut signal, if !signalled => {
                    // Without a drain period, every session closes at once (1001).
                    if state.config().shutdown.drain_period.is_zero() {
                        break;
                    }
                    signalled = true;
                    tokio::spawn(api::admin::run(state.clone()));
                }
                () = state.sessions.drained(), if signalled => break,
                () = state.shutdown.cancelled() => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _peer)) => serving.serve(stream),
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }
        drop(self.listener);
        tracing::info!("shutting down: closing connections");
        state.shutdown.cancel();
        state.sessions.stop_all();
        state.tasks.close();
        let grace = state.config().shutdown.grace;
        http_tasks.close();
        let drained = tokio::time::timeout(grace, async {
            tokio::join!(http_tasks.wait(), state.tasks.wait());
        })
        .await;
        if drained.is_err() {
            tracing::warn!(?grace, "grace period over with connections still open");
        }
        // The keeper stops on the shutdown token; wait so it never races the
        // engine's close.
        let _ = keeper.await;
        let _ = scheduler.await;
        let _ = deliverer.await;
        let _ = consumers.await;
        let _ = reporter.await;
        state.engine.close().await;
        tracing::info!("shutdown complete");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn caps_fit_the_open_files_limit() {
        // Plenty of descriptors: as configured.
        assert_eq!(super::fit_caps(1_048_576, 100_000, 4096), (100_000, 4096));
        // 20000: a reserve of 1000, HTTP as configured, WebSockets the rest.
        assert_eq!(super::fit_caps(20_000, 100_000, 4096), (14_904, 4096));
        // 1024: a reserve of 256, HTTP at most half of the rest.
        assert_eq!(super::fit_caps(1024, 100_000, 4096), (384, 384));
    }
}
