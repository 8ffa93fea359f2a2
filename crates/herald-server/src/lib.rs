//! Herald's network side: the listener, the WebSocket gateway and sessions,
//! the HTTP API, the hub, metrics and graceful shutdown.
//!
//! This crate drives an [`Engine`] and never touches storage itself: every
//! durable or cross-node effect goes through the engine, and fan-out comes
//! back from it into the [`hub::Hub`]. It must never block a runtime thread,
//! await a slow peer while holding shared state, or queue without a bound.

pub mod auth;
pub mod config;
mod console;
mod error;
mod http;
mod http_rooms;
pub mod hub;
pub mod metrics;
mod publish;
mod rooms;
mod session;
mod ws;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use herald_core::Engine;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::Config;
pub use error::ApiError;

/// Shared server state. Sessions and handlers hold it by `Arc`.
pub struct State {
    pub config: Config,
    pub engine: Arc<dyn Engine>,
    pub hub: Arc<hub::Hub>,
    pub metrics: Arc<metrics::Metrics>,
    jwt: auth::JwtVerifier,
    api_keys: auth::ApiKeys,
    in_flight: publish::InFlight,
    /// Cancelled when shutdown starts.
    pub shutdown: CancellationToken,
    /// WebSocket tasks (axum/hyper do not track upgraded connections).
    tasks: TaskTracker,
    open_connections: AtomicUsize,
    /// Effective WebSocket connection cap (config, lowered to fit the
    /// open-files limit).
    pub max_connections: usize,
    next_conn_id: AtomicU64,
    /// Heartbeat period of a connection holding presence leases: pings,
    /// idle and token checks, and lease renewals (at most a third of the
    /// lease TTL). Other connections tick every `limits.ping_interval`.
    pub presence_tick: Duration,
}

/// Raise the soft open-files limit to the hard one and return the connection
/// cap that keeps us clear of EMFILE (a reserve for HTTP, storage and logs).
pub fn fit_connection_cap(configured: usize) -> usize {
    let limit = rlimit::increase_nofile_limit(u64::MAX).unwrap_or(1024) as usize;
    let reserve = (limit / 20).max(256);
    configured.min(limit.saturating_sub(reserve).max(1))
}

pub struct Server {
    state: Arc<State>,
    listener: TcpListener,
}

impl Server {
    /// Bind the listener and wire the engine's fan-out into the hub.
    pub async fn bind(config: Config, engine: Arc<dyn Engine>) -> std::io::Result<Server> {
        let listener = TcpListener::bind(config.listen).await?;
        let metrics = Arc::new(metrics::Metrics::with_engine(&engine));
        let hub = Arc::new(hub::Hub::new(metrics.clone(), &config.limits));
        engine.set_sink(hub.clone());
        let jwt = auth::JwtVerifier::new(&config.jwt)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let presence_tick = config.limits.ping_interval.min(config.presence.renew_interval());
        let state = Arc::new(State {
            presence_tick,
            max_connections: fit_connection_cap(config.limits.max_connections),
            api_keys: auth::ApiKeys::new(&config.api_keys),
            config,
            engine,
            hub,
            metrics,
            jwt,
            in_flight: publish::InFlight::default(),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            open_connections: AtomicUsize::new(0),
            next_conn_id: AtomicU64::new(1),
        });
        Ok(Server { state, listener })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound listener has an address")
    }

    pub fn state(&self) -> &Arc<State> {
        &self.state
    }

    fn router(&self) -> Router {
        Router::new()
            .route("/ws", get(ws::upgrade))
            .route("/api/v1/channels/{channel}/messages", post(http::publish_one).get(http::history))
            .route("/api/v1/publish", post(http::publish_batch))
            .route("/api/v1/channels/{channel}/cursors", get(http::cursors))
            .route("/api/v1/users/{user}/inbox", get(http::inbox))
            .route("/api/v1/channels/{channel}/presence", get(http_rooms::presence))
            .route(
                "/api/v1/rooms/{room}",
                get(http_rooms::get_room)
                    .put(http_rooms::create_room)
                    .patch(http_rooms::patch_room)
                    .delete(http_rooms::delete_room),
            )
            .route("/healthz", get(http::healthz))
            .route("/readyz", get(http::readyz))
            .route("/metrics", get(http::metrics))
            .merge(console::router())
            .fallback(http::not_found)
            .layer(DefaultBodyLimit::max(self.state.config.limits.max_body_bytes))
            .with_state(self.state.clone())
    }

    /// Serve until `signal` resolves, then shut down gracefully: stop
    /// accepting, close every WebSocket with 1001, let HTTP requests finish,
    /// wait up to the grace period, and close the engine (flush).
    pub async fn run(self, signal: impl Future<Output = ()>) -> std::io::Result<()> {
        let router = self.router();
        let state = self.state.clone();
        let http_tasks = TaskTracker::new();
        let http = hyper::server::conn::http1::Builder::new();
        let keeper = tokio::spawn(rooms::keeper(state.clone()));
        tokio::pin!(signal);
        loop {
            tokio::select! {
                () = &mut signal => break,
                () = state.shutdown.cancelled() => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _peer)) => {
                        let _ = stream.set_nodelay(true);
                        let service = TowerToHyperService::new(router.clone());
                        let conn = http.serve_connection(TokioIo::new(stream), service).with_upgrades();
                        let shutdown = state.shutdown.clone();
                        http_tasks.spawn(async move {
                            tokio::pin!(conn);
                            let result = tokio::select! {
                                r = conn.as_mut() => r,
                                () = shutdown.cancelled() => {
                                    // Finish the request in progress, then close.
                                    conn.as_mut().graceful_shutdown();
                                    conn.await
                                }
                            };
                            if let Err(e) = result {
                                tracing::debug!(error = %e, "http connection ended with an error");
                            }
                        });
                    }
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
        state.tasks.close();
        let grace = state.config.limits.shutdown_grace;
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
        state.engine.close().await;
        tracing::info!("shutdown complete");
        Ok(())
    }
}
