//! [`Config::validate`]: every rule across keys, each error one line naming
//! the keys by their path in the file.

use std::time::Duration;

use super::{Config, EngineKind};

/// The most channels `sse.max_channels` may allow: a stream's
/// `Last-Event-ID` holds a position per channel, and browsers and proxies
/// pass headers of a few kilobytes.
const MAX_SSE_CHANNELS: usize = 64;

impl Config {
    /// Check the whole configuration; the error is one line for the operator.
    pub fn validate(&self) -> Result<(), String> {
        self.namespaces.validate()?;
        crate::webhooks::config::validate_all(&self.webhooks)?;
        crate::consumers::config::validate_all(&self.consumers)?;
        self.proxies.validate()?;
        if self.personal.subscribe && !self.namespaces.0.contains_key(&self.personal.namespace) {
            return Err(format!(
                "personal.namespace `{}` is not a configured namespace",
                self.personal.namespace
            ));
        }
        if !(1..=MAX_SSE_CHANNELS).contains(&self.sse.max_channels) {
            return Err(format!("sse.max_channels must be 1..={MAX_SSE_CHANNELS}"));
        }
        if self.sse.retry.is_zero() {
            return Err("sse.retry must be positive".into());
        }
        let h = &self.http;
        if h.max_connections < 16 {
            return Err("http.max_connections must be at least 16".into());
        }
        if h.header_read_timeout.is_zero() || h.body_read_timeout.is_zero() || h.keep_alive_timeout.is_zero()
        {
            return Err(
                "http.header_read_timeout, body_read_timeout and keep_alive_timeout must be positive".into(),
            );
        }
        // Above 64 KiB hyper answers a long URI with a bare 414; below, every
        // oversized head is a 431 problem document.
        if !(1024..=65_535).contains(&h.max_header_bytes) {
            return Err("http.max_header_bytes must be 1024..=65535".into());
        }
        if h.max_body_bytes < 256 {
            return Err("http.max_body_bytes must be at least 256".into());
        }
        if h.http2_max_concurrent_streams == 0 {
            return Err("http.http2_max_concurrent_streams must be at least 1".into());
        }
        let ws = &self.websocket;
        if ws.max_connections == 0 {
            return Err("websocket.max_connections must be at least 1".into());
        }
        if ws.max_message_bytes < 256 {
            return Err("websocket.max_message_bytes must be at least 256".into());
        }
        if ws.max_publishes_in_flight == 0 {
            return Err("websocket.max_publishes_in_flight must be at least 1".into());
        }
        if ws.max_publish_bytes_in_flight == 0 {
            return Err("websocket.max_publish_bytes_in_flight must be at least 1".into());
        }
        if ws.outbox_capacity < 16 {
            return Err("websocket.outbox_capacity must be at least 16".into());
        }
        if ws.max_subscriptions == 0 {
            return Err("websocket.max_subscriptions must be at least 1".into());
        }
        // A frame may exceed `max_message_bytes` by its envelope (channel,
        // id, meta); twice the largest message leaves room for it and one more.
        if ws.outbox_bytes < 2 * ws.max_message_bytes {
            return Err("websocket.outbox_bytes must be at least twice websocket.max_message_bytes".into());
        }
        if ws.total_outbox_bytes < 2 * ws.outbox_bytes {
            return Err("websocket.total_outbox_bytes must be at least twice websocket.outbox_bytes".into());
        }
        let p = &self.publish;
        if p.max_batch_channels == 0 || p.max_batch_messages == 0 || self.history.max_limit == 0 {
            return Err(
                "publish.max_batch_channels, publish.max_batch_messages and history.max_limit must be at least 1"
                    .into(),
            );
        }
        if p.max_data_depth == 0 || p.max_data_depth > herald_proto::MAX_DATA_DEPTH_LIMIT {
            return Err(format!(
                "publish.max_data_depth must be 1..={} (deeper data would not parse in common clients)",
                herald_proto::MAX_DATA_DEPTH_LIMIT
            ));
        }
        let r = &self.rate_limits;
        if r.client_frames_per_sec == 0 {
            return Err("rate_limits.client_frames_per_sec must be at least 1".into());
        }
        if r.close_percent == 0 || r.close_window < Duration::from_millis(100) {
            return Err("rate_limits.close_percent must be at least 1 and close_window at least 100ms".into());
        }
        if r.error_replies_per_sec == 0 {
            return Err("rate_limits.error_replies_per_sec must be at least 1".into());
        }
        let hb = &self.heartbeat;
        if hb.ping_interval.is_zero() || hb.idle_timeout <= hb.ping_interval {
            return Err(
                "heartbeat.idle_timeout must be longer than heartbeat.ping_interval (and both non-zero)"
                    .into(),
            );
        }
        if self.engine == EngineKind::Redis {
            if self.redis.url.split(',').all(|u| u.trim().is_empty()) {
                return Err("redis.url must name at least one Redis".into());
            }
            self.redis.validate()?;
        }
        let pr = &self.presence;
        if pr.member_lease_ttl < Duration::from_millis(300)
            || pr.sweep_interval.is_zero()
            || pr.max_members_listed == 0
        {
            return Err(
                "presence.member_lease_ttl must be at least 300ms, sweep_interval positive and max_members_listed at least 1"
                    .into(),
            );
        }
        self.storage.validate()?;
        if self.idempotency_ttl.is_zero() {
            return Err("idempotency_ttl must be positive".into());
        }
        if self.api_keys.iter().any(|k| k.len() < 16) {
            return Err("api_keys must each be at least 16 characters".into());
        }
        if let Some(s) = &self.jwt.hs256_secret {
            if s.len() < 32 {
                return Err("jwt.hs256_secret must be at least 32 bytes".into());
            }
        }
        crate::auth::JwtVerifier::new(&self.jwt).map_err(|e| format!("jwt: {e}"))?;
        crate::browser::Origins::parse(&self.allowed_origins).map_err(|e| format!("allowed_origins: {e}"))?;
        crate::browser::Origins::parse(&self.cors_origins).map_err(|e| format!("cors_origins: {e}"))?;
        Ok(())
    }
}
