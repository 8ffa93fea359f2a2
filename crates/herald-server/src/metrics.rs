//! Prometheus metrics. One `Metrics` per server, shared by handle; every
//! update is a relaxed atomic, cheap on hot paths.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Exports the engine's own figures (`Engine::metrics`) on every scrape as
/// `herald_engine_*`. Holds the engine weakly: the engine holds the hub as
/// its sink and the hub holds these metrics, so a strong handle would be a
/// cycle that keeps the engine (and its data-dir lock) alive forever.
struct EngineCollector(std::sync::Weak<dyn herald_core::Engine>);

impl std::fmt::Debug for EngineCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EngineCollector")
    }
}

impl prometheus_client::collector::Collector for EngineCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let Some(engine) = self.0.upgrade() else { return Ok(()) };
        for m in engine.metrics() {
            let name = format!("engine_{}", m.name);
            if m.gauge {
                let g = ConstGauge::new(i64::try_from(m.value).unwrap_or(i64::MAX));
                g.encode(encoder.encode_descriptor(&name, m.help, None, g.metric_type())?)?;
            } else {
                let c = ConstCounter::new(m.value);
                c.encode(encoder.encode_descriptor(&name, m.help, None, c.metric_type())?)?;
            }
        }
        Ok(())
    }
}

/// The socket protocols, as the `protocol` label says them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Herald's own, on `/ws`.
    Herald = 0,
    /// Centrifugo's client protocol, on `/connection/websocket`.
    Centrifugo = 1,
}

impl Protocol {
    pub const fn label(self) -> &'static str {
        match self {
            Protocol::Herald => "herald",
            Protocol::Centrifugo => "centrifugo",
        }
    }
}

pub struct Metrics {
    registry: Registry,
    /// Open WebSocket connections.
    pub connections: Gauge,
    pub connections_total: Counter,
    /// Upgrades refused at the connection cap.
    pub connections_rejected: Counter,
    /// Open connections that are not WebSocket sessions.
    pub http_connections: Gauge,
    pub http_connections_opened: Counter,
    /// HTTP connections closed by the server before a request completed,
    /// by reason (`header_timeout`, `idle_timeout`, `body_timeout`,
    /// `evicted`, `rejected`).
    pub http_connections_dropped: Family<[(&'static str, &'static str); 1], Counter>,
    /// WebSocket upgrades refused for their `Origin`.
    pub origin_refused: Counter,
    /// Active subscriptions over all connections.
    pub subscriptions: Gauge,
    /// Messages appended (or broadcast, for volatile) by publishes.
    pub published: Counter,
    /// Publishes answered from an idempotency receipt.
    pub dedup_hits: Counter,
    /// Message frames written to sockets (catch-up and live).
    pub delivered: Counter,
    /// Connections closed with 4008 because their outbox was full.
    pub slow_consumers: Counter,
    /// Volatile messages dropped for a full outbox.
    pub volatile_dropped: Counter,
    /// Publish requests failed by the engine (answered 503).
    pub engine_errors: Counter,
    /// Time from publish request to durable receipt, seconds.
    pub publish_latency: Histogram,
    /// Acks that advanced a cursor.
    pub acks: Counter,
    /// Acked messages sent again after `ack_timeout`.
    pub redeliveries: Counter,
    /// Acked subscriptions that reached `max_attempts` on a connection.
    pub acked_stale: Counter,
    /// Unacked messages removed by retention before their subscriber resumed.
    pub acked_truncated: Counter,
    /// Presence members that joined (new leases, not reclaims).
    pub presence_joins: Counter,
    /// Presence members that left cleanly (unsubscribe, close, kick).
    pub presence_leaves: Counter,
    /// Presence leases that expired (connection lost, node died).
    pub presence_expired: Counter,
    /// Room state or attribute changes written (API and automatic).
    pub room_changes: Counter,
    /// Client frames refused by the frame budget.
    pub frames_refused: Counter,
    /// Open WebSocket connections by protocol (`herald` on `/ws`,
    /// `centrifugo` on `/connection/websocket`).
    pub protocol_connections: Family<[(&'static str, &'static str); 1], Gauge>,
    /// Client frames (`/ws`) and commands (Centrifugo) read, by protocol.
    pub protocol_frames: Family<[(&'static str, &'static str); 1], Counter>,
    /// The two series of `protocol_frames`, looked up once and indexed by
    /// `Protocol as usize`: counted on every frame read, where the family's
    /// lookup (a lock and a hash of the labels) cost more than the count.
    frames_of: [Counter; 2],
    /// `error` frames not sent because of `rate_limits.error_replies_per_sec`.
    pub error_replies_dropped: Counter,
    /// Bytes of frames queued for delivery, server-wide (each frame once).
    /// Its atomic is the server's accounting itself (see `hub::QueuedBytes`).
    pub outbox_bytes: Gauge,
    /// Connections the server closed, by reason (see [`Metrics::closed`]).
    closes: Family<[(&'static str, &'static str); 1], Counter>,
    /// Messages not queued for a connection, by the bound that refused them.
    pub outbox_full_frames: Counter,
    pub outbox_full_bytes: Counter,
    pub outbox_full_total: Counter,
    /// Connections kicked (4008) to bring queued bytes under the ceiling.
    pub outbox_shed: Counter,
    /// Scheduled messages not yet delivered (set by the scheduler).
    pub scheduled_pending: Gauge,
    /// Scheduled messages appended by this node's scheduler.
    pub scheduled_delivered: Counter,
    /// Schedules cancelled (API, or their room closed).
    pub scheduled_cancelled: Counter,
    /// How long after its `deliver_at` a scheduled message was appended.
    pub scheduled_lateness: Histogram,
    /// Messages acknowledged by a webhook's backend, per webhook.
    pub webhook_delivered: Family<[(&'static str, String); 1], Counter>,
    /// Failed webhook requests, per webhook and class (`status`,
    /// `timeout`, `connect`, `other`, `engine`).
    pub webhook_failures: Family<[(&'static str, String); 2], Counter>,
    /// Undelivered messages per webhook, summed over its channels at the
    /// last poll on this node.
    pub webhook_lag: Family<[(&'static str, String); 1], Gauge>,
    /// Messages retention removed before the webhook delivered them.
    pub webhook_overtaken: Family<[(&'static str, String); 1], Counter>,
    /// One webhook request, sent to answered (or failed).
    pub webhook_request_duration: Histogram,
    /// Proxy questions by proxy (`connect`, `subscribe`, `publish`) and
    /// outcome (`allow`, `replace`, `refuse`, `fail`, `cached`).
    pub proxy_requests: Family<[(&'static str, &'static str); 2], Counter>,
    /// One proxy question, sent to answered (or failed).
    pub proxy_request_duration: Histogram,
}

/// The `reason` label of `herald_closes_total` for a close code.
fn close_reason(code: u16) -> &'static str {
    use herald_proto::close;
    match code {
        close::GOING_AWAY => "shutdown",
        close::MESSAGE_TOO_BIG => "message_too_big",
        close::INTERNAL => "internal",
        close::BAD_REQUEST => "bad_request",
        close::UNAUTHORIZED => "unauthorized",
        close::TOKEN_EXPIRED => "token_expired",
        close::IDLE_TIMEOUT => "idle_timeout",
        close::RESYNC => "resync",
        close::SLOW_CONSUMER => "slow_consumer",
        close::RATE_LIMITED => "rate_limited",
        _ => "other",
    }
}

impl Metrics {
    /// The server's metrics plus the engine's own (`herald_engine_*`).
    pub fn with_engine(engine: &std::sync::Arc<dyn herald_core::Engine>) -> Self {
        let mut m = Self::default();
        m.registry.register_collector(Box::new(EngineCollector(std::sync::Arc::downgrade(engine))));
        m
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("herald");
        let m = Metrics {
            connections: Gauge::default(),
            connections_total: Counter::default(),
            connections_rejected: Counter::default(),
            http_connections: Gauge::default(),
            http_connections_opened: Counter::default(),
            http_connections_dropped: Family::default(),
            origin_refused: Counter::default(),
            subscriptions: Gauge::default(),
            published: Counter::default(),
            dedup_hits: Counter::default(),
            delivered: Counter::default(),
            slow_consumers: Counter::default(),
            volatile_dropped: Counter::default(),
            engine_errors: Counter::default(),
            publish_latency: Histogram::new(exponential_buckets(0.0001, 2.0, 18)),
            acks: Counter::default(),
            redeliveries: Counter::default(),
            acked_stale: Counter::default(),
            acked_truncated: Counter::default(),
            presence_joins: Counter::default(),
            presence_leaves: Counter::default(),
            presence_expired: Counter::default(),
            room_changes: Counter::default(),
            frames_refused: Counter::default(),
            protocol_connections: Family::default(),
            protocol_frames: Family::default(),
            frames_of: Default::default(),
            error_replies_dropped: Counter::default(),
            outbox_bytes: Gauge::default(),
            closes: Family::default(),
            outbox_full_frames: Counter::default(),
            outbox_full_bytes: Counter::default(),
            outbox_full_total: Counter::default(),
            outbox_shed: Counter::default(),
            scheduled_pending: Gauge::default(),
            scheduled_delivered: Counter::default(),
            scheduled_cancelled: Counter::default(),
            scheduled_lateness: Histogram::new(exponential_buckets(0.001, 2.0, 20)),
            webhook_delivered: Family::default(),
            webhook_failures: Family::default(),
            webhook_lag: Family::default(),
            webhook_overtaken: Family::default(),
            webhook_request_duration: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            proxy_requests: Family::default(),
            proxy_request_duration: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            registry: Registry::default(),
        };
        registry.register("connections", "Open WebSocket connections", m.connections.clone());
        registry.register(
            "connections_opened",
            "WebSocket connections accepted",
            m.connections_total.clone(),
        );
        registry.register(
            "connections_rejected",
            "WebSocket upgrades refused at the connection cap",
            m.connections_rejected.clone(),
        );
        registry.register(
            "http_connections",
            "Open connections that are not WebSocket sessions",
            m.http_connections.clone(),
        );
        registry.register(
            "http_connections_opened",
            "Connections accepted (HTTP; each WebSocket starts as one)",
            m.http_connections_opened.clone(),
        );
        registry.register(
            "http_connections_dropped",
            "HTTP connections closed by the server, by reason",
            m.http_connections_dropped.clone(),
        );
        registry.register(
            "origin_refused",
            "WebSocket upgrades refused for their Origin",
            m.origin_refused.clone(),
        );
        registry.register("subscriptions", "Active subscriptions", m.subscriptions.clone());
        registry.register("presence_joins", "Presence members that joined", m.presence_joins.clone());
        registry.register("presence_leaves", "Presence members that left cleanly", m.presence_leaves.clone());
        registry.register("presence_expired", "Presence leases that expired", m.presence_expired.clone());
        registry.register("room_changes", "Room state or attribute changes", m.room_changes.clone());
        registry.register("published", "Messages published", m.published.clone());
        registry.register(
            "dedup_hits",
            "Publishes answered from an idempotency receipt",
            m.dedup_hits.clone(),
        );
        registry.register("delivered", "Message frames written to sockets", m.delivered.clone());
        registry.register(
            "slow_consumer_disconnects",
            "Connections closed because their outbox was full",
            m.slow_consumers.clone(),
        );
        registry.register(
            "volatile_dropped",
            "Volatile messages dropped for a full outbox",
            m.volatile_dropped.clone(),
        );
        registry.register("engine_errors", "Publishes failed by the storage engine", m.engine_errors.clone());
        registry.register(
            "publish_latency_seconds",
            "Publish request to durable receipt",
            m.publish_latency.clone(),
        );
        registry.register("acks", "Acks that advanced a subscriber's cursor", m.acks.clone());
        registry.register(
            "redeliveries",
            "Acked messages sent again after ack_timeout",
            m.redeliveries.clone(),
        );
        registry.register(
            "acked_stale",
            "Acked subscriptions that reached max_attempts on a connection",
            m.acked_stale.clone(),
        );
        registry.register(
            "acked_truncated",
            "Unacked messages removed by retention before their subscriber resumed",
            m.acked_truncated.clone(),
        );
        registry.register(
            "frames_refused",
            "Client frames refused by the frame budget (rate_limits.client_frames_per_sec)",
            m.frames_refused.clone(),
        );
        registry.register(
            "protocol_connections",
            "Open WebSocket connections by protocol",
            m.protocol_connections.clone(),
        );
        registry.register(
            "protocol_frames",
            "Client frames (or Centrifugo commands) read, by protocol",
            m.protocol_frames.clone(),
        );
        registry.register(
            "error_replies_dropped",
            "Error frames not sent because of rate_limits.error_replies_per_sec",
            m.error_replies_dropped.clone(),
        );
        registry.register(
            "outbox_bytes",
            "Bytes of frames queued for delivery, each frame once (ceiling: websocket.total_outbox_bytes)",
            m.outbox_bytes.clone(),
        );
        registry.register("closes", "Connections closed by the server, by reason", m.closes.clone());
        registry.register(
            "outbox_shed",
            "Connections kicked because they held the most queued bytes at the server's ceiling",
            m.outbox_shed.clone(),
        );
        registry.register(
            "scheduled_pending",
            "Scheduled messages not yet delivered",
            m.scheduled_pending.clone(),
        );
        registry.register(
            "scheduled_delivered",
            "Scheduled messages appended by this node",
            m.scheduled_delivered.clone(),
        );
        registry.register(
            "scheduled_cancelled",
            "Schedules cancelled (API or closed room)",
            m.scheduled_cancelled.clone(),
        );
        registry.register(
            "scheduled_lateness_seconds",
            "Time from a schedule's deliver_at to its append",
            m.scheduled_lateness.clone(),
        );
        let outbox_full: Family<[(&'static str, &'static str); 1], Counter> = Family::default();
        // One statement each: a `get_or_create` guard holds the family's
        // lock until the end of its statement.
        let outbox_full_frames = outbox_full.get_or_create(&[("limit", "frames")]).clone();
        let outbox_full_bytes = outbox_full.get_or_create(&[("limit", "bytes")]).clone();
        let outbox_full_total = outbox_full.get_or_create(&[("limit", "server")]).clone();
        let m = Metrics { outbox_full_frames, outbox_full_bytes, outbox_full_total, ..m };
        registry.register(
            "outbox_full",
            "Messages not queued for a connection, by the bound that refused them",
            outbox_full,
        );
        registry.register(
            "webhook_delivered",
            "Messages acknowledged by a webhook's backend",
            m.webhook_delivered.clone(),
        );
        registry.register("webhook_failures", "Failed webhook requests by class", m.webhook_failures.clone());
        registry.register("webhook_lag_messages", "Undelivered messages per webhook", m.webhook_lag.clone());
        registry.register(
            "webhook_overtaken_messages",
            "Messages removed by retention before the webhook delivered them",
            m.webhook_overtaken.clone(),
        );
        registry.register(
            "webhook_request_duration_seconds",
            "Webhook request, sent to answered",
            m.webhook_request_duration.clone(),
        );
        registry.register("proxy_requests", "Backend proxy questions by outcome", m.proxy_requests.clone());
        registry.register(
            "proxy_request_duration_seconds",
            "Backend proxy question, sent to answered",
            m.proxy_request_duration.clone(),
        );
        // A family's series is a clone of one shared counter.
        let frames_of = [Protocol::Herald, Protocol::Centrifugo]
            .map(|p| m.protocol_frames.get_or_create(&[("protocol", p.label())]).clone());
        Metrics { registry, frames_of, ..m }
    }
}

impl Metrics {
    /// Count an HTTP connection closed (or refused) by the server.
    pub fn http_dropped(&self, reason: &'static str) {
        self.http_connections_dropped.get_or_create(&[("reason", reason)]).inc();
    }

    /// Count a connection the server closed with `code`.
    /// A connection of `protocol` opened (`+1`) or ended (`-1`).
    pub fn protocol_connection(&self, protocol: Protocol, delta: i64) {
        self.protocol_connections.get_or_create(&[("protocol", protocol.label())]).inc_by(delta);
    }

    /// A client frame (or Centrifugo command) of `protocol` was read.
    pub fn protocol_frame(&self, protocol: Protocol) {
        self.frames_of[protocol as usize].inc();
    }

    pub fn closed(&self, code: u16) {
        self.closes.get_or_create(&[("reason", close_reason(code))]).inc();
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_counted_under_their_own_protocol() {
        let m = Metrics::default();
        m.protocol_frame(Protocol::Herald);
        m.protocol_frame(Protocol::Centrifugo);
        m.protocol_frame(Protocol::Centrifugo);
        let text = m.render();
        assert!(text.contains("herald_protocol_frames_total{protocol=\"herald\"} 1"), "{text}");
        assert!(text.contains("herald_protocol_frames_total{protocol=\"centrifugo\"} 2"), "{text}");
    }
}
