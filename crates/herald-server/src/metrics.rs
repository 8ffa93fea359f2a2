//! Prometheus metrics. One `Metrics` per server, shared by handle; every
//! update is a relaxed atomic, cheap on hot paths. Each metric is declared
//! once, in the `server_metrics!` table: its field, its constructor and its
//! registration. What `/metrics` exports (names, help texts, types, labels)
//! is checked against `metrics/exported.txt`.

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
        let healthy = ConstGauge::new(i64::from(matches!(engine.health(), herald_core::Health::Ready)));
        healthy.encode(encoder.encode_descriptor(
            "engine_healthy",
            "1 while the engine takes writes (what /readyz reports), 0 while it refuses them.",
            None,
            healthy.metric_type(),
        )?)?;
        Ok(())
    }
}

/// The socket protocols, as the `protocol` label says them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Herald's own, on `/ws`.
    Herald = 0,
    /// Centrifugo's client protocol, JSON, on `/connection/websocket`.
    Centrifugo = 1,
    /// The same, Protobuf.
    CentrifugoProtobuf = 2,
    /// Server-Sent Events, on `/sse`.
    Sse = 3,
}

impl Protocol {
    pub const fn label(self) -> &'static str {
        match self {
            Protocol::Herald => "herald",
            Protocol::Centrifugo => "centrifugo",
            Protocol::CentrifugoProtobuf => "centrifugo_protobuf",
            Protocol::Sse => "sse",
        }
    }
}

/// Declare the server's metrics once: each entry is a field of
/// [`Metrics`] (with its doc, visibility, type and, unless it is the
/// type's `Default`, its constructor) and, with a name and a help text,
/// its registration under `herald_`, in table order (the order of
/// `/metrics`). The `derived` entries are fields made from the table's
/// after every registration: handles looked up once for the hot paths.
macro_rules! server_metrics {
    (
        $(#[$struct_meta:meta])*
        pub struct $Metrics:ident;
        registered {
            $(
                $(#[$meta:meta])*
                $vis:vis $field:ident: $ty:ty $(= $init:expr)? => $name:literal: $help:literal
            ),* $(,)?
        }
        derived {
            $(
                $(#[$dmeta:meta])*
                $dvis:vis $dfield:ident: $dty:ty = $dinit:expr
            ),* $(,)?
        }
    ) => {
        $(#[$struct_meta])*
        pub struct $Metrics {
            registry: Registry,
            $( $(#[$meta])* $vis $field: $ty, )*
            $( $(#[$dmeta])* $dvis $dfield: $dty, )*
        }

        impl Default for $Metrics {
            fn default() -> Self {
                let mut registry = Registry::with_prefix("herald");
                $(
                    let $field: $ty = server_metrics!(@init $($init)?);
                    registry.register($name, $help, $field.clone());
                )*
                // One statement each: a family's `get_or_create` guard
                // holds the family's lock until the end of its statement.
                $( let $dfield: $dty = $dinit; )*
                $Metrics { registry, $($field,)* $($dfield,)* }
            }
        }

        impl $Metrics {
            /// Every metric of the table as `/metrics` names its family
            /// (`# TYPE`: a counter without `_total`, a histogram without
            /// `_bucket`/`_sum`/`_count`), in table order. A labelled
            /// family is exported only once it has a series; this lists
            /// it from the start.
            pub const FAMILIES: &'static [&'static str] = &[$(concat!("herald_", $name)),*];
        }
    };
    (@init) => { Default::default() };
    (@init $init:expr) => { $init };
}

/// A family of series with one label.
type Labelled<M, V = &'static str> = Family<[(&'static str, V); 1], M>;

server_metrics! {
    /// The server's metrics, shared by handle. Every update is a relaxed
    /// atomic; a family's series on a hot path is a handle looked up once
    /// (see `frames_of`).
    pub struct Metrics;
    registered {
        /// Open WebSocket connections.
        pub connections: Gauge => "connections": "Open WebSocket connections",
        pub connections_total: Counter => "connections_opened": "WebSocket connections accepted",
        /// Upgrades refused at the connection cap.
        pub connections_rejected: Counter
            => "connections_rejected": "WebSocket upgrades refused at the connection cap",
        /// Open connections that are not WebSocket sessions.
        pub http_connections: Gauge
            => "http_connections": "Open connections that are not WebSocket sessions",
        pub http_connections_opened: Counter
            => "http_connections_opened": "Connections accepted (HTTP; each WebSocket starts as one)",
        /// HTTP connections closed by the server before a request completed,
        /// by reason (`header_timeout`, `idle_timeout`, `body_timeout`,
        /// `evicted`, `rejected`).
        pub http_connections_dropped: Labelled<Counter>
            => "http_connections_dropped": "HTTP connections closed by the server, by reason",
        /// WebSocket upgrades refused for their `Origin`.
        pub origin_refused: Counter => "origin_refused": "WebSocket upgrades refused for their Origin",
        /// Active subscriptions over all connections.
        pub subscriptions: Gauge => "subscriptions": "Active subscriptions",
        /// Presence members that joined (new leases, not reclaims).
        pub presence_joins: Counter => "presence_joins": "Presence members that joined",
        /// Presence members that left cleanly (unsubscribe, close, kick).
        pub presence_leaves: Counter => "presence_leaves": "Presence members that left cleanly",
        /// Presence leases that expired (connection lost, node died).
        pub presence_expired: Counter => "presence_expired": "Presence leases that expired",
        /// Room state or attribute changes written (API and automatic).
        pub room_changes: Counter => "room_changes": "Room state or attribute changes",
        /// Messages appended (or broadcast, for volatile) by publishes.
        pub published: Counter => "published": "Messages published",
        /// Publishes answered from an idempotency receipt.
        pub dedup_hits: Counter => "dedup_hits": "Publishes answered from an idempotency receipt",
        /// Message frames written to sockets (catch-up and live).
        pub delivered: Counter => "delivered": "Message frames written to sockets",
        /// Connections closed with 4008 because their outbox was full.
        pub slow_consumers: Counter
            => "slow_consumer_disconnects": "Connections closed because their outbox was full",
        /// Volatile messages dropped for a full outbox.
        pub volatile_dropped: Counter => "volatile_dropped": "Volatile messages dropped for a full outbox",
        /// Publish requests failed by the engine (answered 503).
        pub engine_errors: Counter => "engine_errors": "Publishes failed by the storage engine",
        /// Time from publish request to durable receipt, seconds.
        pub publish_latency: Histogram = Histogram::new(exponential_buckets(0.0001, 2.0, 18))
            => "publish_latency_seconds": "Publish request to durable receipt",
        /// Acks that advanced a cursor.
        pub acks: Counter => "acks": "Acks that advanced a subscriber's cursor",
        /// Acked messages sent again after `ack_timeout`.
        pub redeliveries: Counter => "redeliveries": "Acked messages sent again after ack_timeout",
        /// Acked subscriptions that reached `max_attempts` on a connection.
        pub acked_stale: Counter
            => "acked_stale": "Acked subscriptions that reached max_attempts on a connection",
        /// Unacked messages removed by retention before their subscriber resumed.
        pub acked_truncated: Counter
            => "acked_truncated": "Unacked messages removed by retention before their subscriber resumed",
        /// Client frames refused by the frame budget.
        pub frames_refused: Counter
            => "frames_refused": "Client frames refused by the frame budget (rate_limits.client_frames_per_sec)",
        /// Open WebSocket connections by protocol (`herald` on `/ws`,
        /// `centrifugo` on `/connection/websocket`).
        pub protocol_connections: Labelled<Gauge>
            => "protocol_connections": "Open client connections (WebSocket and SSE) by protocol",
        /// Client frames (`/ws`) and commands (Centrifugo) read, by protocol.
        pub protocol_frames: Labelled<Counter>
            => "protocol_frames": "Client frames (or Centrifugo commands) read, by protocol",
        /// `error` frames not sent because of `rate_limits.error_replies_per_sec`.
        pub error_replies_dropped: Counter
            => "error_replies_dropped": "Error frames not sent because of rate_limits.error_replies_per_sec",
        /// Bytes of frames queued for delivery, server-wide (each frame once).
        /// Its atomic is the server's accounting itself (see `hub::QueuedBytes`).
        pub outbox_bytes: Gauge => "outbox_bytes":
            "Bytes of frames queued for delivery, each frame once (ceiling: websocket.total_outbox_bytes)",
        /// Connections the server closed, by reason (see [`Metrics::closed`]).
        closes: Labelled<Counter> => "closes": "Connections closed by the server, by reason",
        /// Connections kicked (4008) to bring queued bytes under the ceiling.
        pub outbox_shed: Counter => "outbox_shed":
            "Connections kicked because they held the most queued bytes at the server's ceiling",
        /// Scheduled messages not yet delivered (set by the scheduler).
        pub scheduled_pending: Gauge => "scheduled_pending": "Scheduled messages not yet delivered",
        /// Scheduled messages appended by this node's scheduler.
        pub scheduled_delivered: Counter
            => "scheduled_delivered": "Scheduled messages appended by this node",
        /// Schedules cancelled (API, or their room closed).
        pub scheduled_cancelled: Counter
            => "scheduled_cancelled": "Schedules cancelled (API or closed room)",
        /// How long after its `deliver_at` a scheduled message was appended.
        pub scheduled_lateness: Histogram = Histogram::new(exponential_buckets(0.001, 2.0, 20))
            => "scheduled_lateness_seconds": "Time from a schedule's deliver_at to its append",
        /// Messages not queued for a connection, by the bound that refused
        /// them (`limit`: `frames`, `bytes`, `server`); counted through the
        /// `outbox_full_*` handles.
        pub outbox_full: Labelled<Counter>
            => "outbox_full": "Messages not queued for a connection, by the bound that refused them",
        /// Messages acknowledged by a webhook's backend, per webhook.
        pub webhook_delivered: Labelled<Counter, String>
            => "webhook_delivered": "Messages acknowledged by a webhook's backend",
        /// Failed webhook requests, per webhook and class (`status`,
        /// `timeout`, `connect`, `other`, `engine`).
        pub webhook_failures: Family<[(&'static str, String); 2], Counter>
            => "webhook_failures": "Failed webhook requests by class",
        /// Undelivered messages per webhook, summed over its channels at the
        /// last poll on this node.
        pub webhook_lag: Labelled<Gauge, String>
            => "webhook_lag_messages": "Undelivered messages per webhook",
        /// Messages retention removed before the webhook delivered them.
        pub webhook_overtaken: Labelled<Counter, String> => "webhook_overtaken_messages":
            "Messages removed by retention before the webhook delivered them",
        /// One webhook request, sent to answered (or failed).
        pub webhook_request_duration: Histogram = Histogram::new(exponential_buckets(0.001, 2.0, 16))
            => "webhook_request_duration_seconds": "Webhook request, sent to answered",
        /// Outbox rows appended by a consumer (new messages), per consumer.
        pub consumer_published: Labelled<Counter, String>
            => "consumer_published": "Outbox rows a consumer appended as new messages",
        /// Outbox rows answered from an earlier append's receipt (a retry
        /// after a crash or a takeover), per consumer.
        pub consumer_duplicates: Labelled<Counter, String>
            => "consumer_duplicates": "Outbox rows already appended before (answered from a receipt)",
        /// Outbox rows moved to the dead-letter table, per consumer.
        pub consumer_parked: Labelled<Counter, String>
            => "consumer_parked": "Outbox rows that could not be published and were parked",
        /// Failed consumer steps (source or engine), per consumer.
        pub consumer_errors: Labelled<Counter, String>
            => "consumer_errors": "Failed consumer steps (source or engine)",
        /// Rows waiting in the source per consumer and partition, at the
        /// owner's last look (at most 100,000 counted).
        pub consumer_lag: Family<[(&'static str, String); 2], Gauge>
            => "consumer_lag_rows": "Outbox rows waiting per consumer and partition",
        /// Proxy questions by proxy (`connect`, `subscribe`, `publish`) and
        /// outcome (`allow`, `replace`, `refuse`, `fail`, `cached`).
        pub proxy_requests: Family<[(&'static str, &'static str); 2], Counter>
            => "proxy_requests": "Backend proxy questions by outcome",
        /// One proxy question, sent to answered (or failed).
        pub proxy_request_duration: Histogram = Histogram::new(exponential_buckets(0.001, 2.0, 14))
            => "proxy_request_duration_seconds": "Backend proxy question, sent to answered",
        /// Configuration reloads (SIGHUP, `POST /api/v1/admin/reload`) by
        /// `result`: `applied` or `refused`.
        pub reloads: Labelled<Counter> => "reloads": "Configuration reloads by result (applied, refused)",
        /// Fetches of the JWKS (`jwt.jwks_url`) by `result`: `ok` or
        /// `failed` (the keys held were kept).
        pub jwks_refreshes: Labelled<Counter>
            => "jwks_refreshes": "JWKS fetches by result (ok, failed: the keys held were kept)",
        /// Keys held from the JWKS (those Herald takes: signature public keys).
        pub jwks_keys: Gauge => "jwks_keys": "Keys held from the JWKS endpoint",
        /// The backend's actions on users taken by this node's API, by
        /// `action` (`disconnect`, `ban`, `revoke`, `subscribe`,
        /// `unsubscribe`, `remove_member`, `list_connections`,
        /// `list_channels`, `list_nodes`).
        pub control_actions: Labelled<Counter>
            => "control_actions": "The backend's actions on users taken through this node's API, by action",
        /// Connections this node closed, subscribed or unsubscribed for the
        /// backend's actions (from any node), by `action`.
        pub control_applied: Labelled<Counter>
            => "control_applied": "Connections this node acted on for the backend's actions, by action",
    }
    derived {
        /// `outbox_full{limit="frames"}`: the outbox held
        /// `websocket.outbox_capacity` frames.
        pub outbox_full_frames: Counter = outbox_full.get_or_create(&[("limit", "frames")]).clone(),
        /// `outbox_full{limit="bytes"}`: the connection held
        /// `websocket.outbox_bytes`.
        pub outbox_full_bytes: Counter = outbox_full.get_or_create(&[("limit", "bytes")]).clone(),
        /// `outbox_full{limit="server"}`: the server was at its ceiling.
        pub outbox_full_total: Counter = outbox_full.get_or_create(&[("limit", "server")]).clone(),
        /// The series of `protocol_frames`, looked up once and indexed by
        /// `Protocol as usize`: counted on every frame read, where the family's
        /// lookup (a lock and a hash of the labels) cost more than the count.
        /// A family's series is a clone of one shared counter.
        frames_of: [Counter; 4] = [Protocol::Herald, Protocol::Centrifugo, Protocol::CentrifugoProtobuf, Protocol::Sse]
            .map(|p| protocol_frames.get_or_create(&[("protocol", p.label())]).clone()),
    }
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
        close::DRAINING => "drain",
        close::DISCONNECTED => "disconnected",
        close::DISCONNECTED_FOR_GOOD => "disconnected_for_good",
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

impl Metrics {
    /// Count an HTTP connection closed (or refused) by the server.
    pub fn http_dropped(&self, reason: &'static str) {
        self.http_connections_dropped.get_or_create(&[("reason", reason)]).inc();
    }

    /// A connection of `protocol` opened (`+1`) or ended (`-1`).
    pub fn protocol_connection(&self, protocol: Protocol, delta: i64) {
        self.protocol_connections.get_or_create(&[("protocol", protocol.label())]).inc_by(delta);
    }

    /// A client frame (or Centrifugo command) of `protocol` was read.
    pub fn protocol_frame(&self, protocol: Protocol) {
        self.frames_of[protocol as usize].inc();
    }

    /// Count a connection the server closed with `code`.
    pub fn closed(&self, code: u16) {
        self.closes.get_or_create(&[("reason", close_reason(code))]).inc();
    }

    /// Count one of the backend's actions taken through this node's API.
    pub fn control_action(&self, action: &'static str) {
        self.control_actions.get_or_create(&[("action", action)]).inc();
    }

    /// Count connections this node acted on for the backend.
    pub fn control_applied(&self, action: &'static str, connections: u64) {
        if connections > 0 {
            self.control_applied.get_or_create(&[("action", action)]).inc_by(connections);
        }
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests;
