//! [`HttpApi`]: a small client for Herald's HTTP API.

use bytes::Bytes;
pub use herald_proto::{History, HistoryMessage, ItemError, MessageItem, MessageResult};
use herald_proto::{
    MessagesBody, MessagesReply, Meta, Problem, PublishBodyRef, Published, ScheduledList, ScheduledReceipt,
};
use http::{HeaderMap, Method};
use serde::Serialize;

use crate::url::encode_path_segment;
use crate::ClientError;

mod control;

/// A response as received, for asserting exact statuses, headers and bodies.
#[derive(Debug, Clone)]
pub struct RawResponse {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl RawResponse {
    /// The body as JSON.
    pub fn json(&self) -> Result<serde_json::Value, ClientError> {
        serde_json::from_slice(&self.body)
            .map_err(|e| ClientError::Protocol(format!("response body is not JSON: {e}")))
    }

    /// The body as a problem document, if it is one.
    pub fn problem(&self) -> Option<Problem> {
        serde_json::from_slice(&self.body).ok()
    }

    /// A header value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// `Ok(self)` for 2xx, [`ClientError::Api`] otherwise.
    pub fn error_for_status(self) -> Result<Self, ClientError> {
        if self.is_success() {
            return Ok(self);
        }
        Err(ClientError::Api {
            status: self.status,
            problem: self.problem().map(Box::new),
            body: String::from_utf8_lossy(&self.body[..self.body.len().min(2048)]).into_owned(),
        })
    }
}

/// A successful publish: the body ([`Published`]) with the status and
/// the replay header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishResult {
    /// 201 for a new message; a replay returns the original status.
    pub status: u16,
    pub channel: String,
    /// `None` on volatile channels.
    pub seq: Option<u64>,
    pub id: String,
    pub epoch: Option<String>,
    /// `Idempotent-Replayed: true`: the key matched an earlier publish and
    /// this is its original result.
    pub replayed: bool,
}

/// When a scheduled publish is delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliverAt {
    /// At this time, ms since the Unix epoch (`deliver_at`).
    At(u64),
    /// This long after the server receives the request (`delay_ms`).
    In(std::time::Duration),
}

/// A publish the server accepted for later delivery (`202 Accepted`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledResult {
    pub scheduled_id: String,
    pub channel: String,
    /// When it is appended, ms since the Unix epoch.
    pub deliver_at: u64,
    /// The Idempotency-Key matched an earlier schedule: its original answer.
    pub replayed: bool,
}

/// A pending schedule, as `GET /api/v1/scheduled` lists it.
pub use herald_proto::ScheduledEntry;

/// Client for `/api/v1`. Cheap to clone (the connection pool is shared).
#[derive(Debug, Clone)]
pub struct HttpApi {
    http: reqwest::Client,
    /// `http://host:port[/prefix]`, no trailing slash.
    base: String,
    api_key: Option<String>,
}

impl HttpApi {
    /// `base_url` is the server address (`http://host:port`; `ws://` is
    /// accepted and means the same). Every request carries
    /// `Authorization: Bearer <api_key>`.
    pub fn new(base_url: &str, api_key: impl Into<String>) -> Self {
        Self { http: build_client(), base: normalise_base(base_url), api_key: Some(api_key.into()) }
    }

    /// A client without credentials (to test refusals, or for `/healthz`).
    pub fn anonymous(base_url: &str) -> Self {
        Self { http: build_client(), base: normalise_base(base_url), api_key: None }
    }

    /// The same server and connection pool with another key (`None`: none).
    pub fn with_api_key(&self, api_key: Option<&str>) -> Self {
        Self { http: self.http.clone(), base: self.base.clone(), api_key: api_key.map(str::to_owned) }
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// `POST /api/v1/channels/{channel}/messages`. Non-2xx is
    /// [`ClientError::Api`] with the status and problem document. `data` is
    /// anything serialisable; a [`serde_json::value::RawValue`] goes out byte for byte.
    pub async fn publish<D: Serialize + ?Sized>(
        &self,
        channel: &str,
        data: &D,
        meta: Option<&Meta>,
        idempotency_key: Option<&str>,
    ) -> Result<PublishResult, ClientError> {
        let body = serde_json::to_vec(&PublishBodyRef { data, meta, deliver_at: None, delay_ms: None })
            .map_err(|e| ClientError::Config(format!("publish body does not serialise: {e}")))?;
        let resp = self.publish_raw(channel, body, idempotency_key).await?.error_for_status()?;
        let Published { channel, seq, id, epoch } = serde_json::from_slice(&resp.body)
            .map_err(|e| ClientError::Protocol(format!("unexpected publish response: {e}")))?;
        let replayed = resp.header("idempotent-replayed").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        Ok(PublishResult { status: resp.status, channel, seq, id, epoch, replayed })
    }

    /// `POST /api/v1/channels/{channel}/messages` with `deliver_at` or
    /// `delay_ms`: the server stores the message and appends it at that
    /// time, exactly once. With an idempotency key a retry schedules once
    /// (and gets the original answer, `replayed`).
    pub async fn publish_scheduled<D: Serialize + ?Sized>(
        &self,
        channel: &str,
        data: &D,
        meta: Option<&Meta>,
        when: DeliverAt,
        idempotency_key: Option<&str>,
    ) -> Result<ScheduledResult, ClientError> {
        let (deliver_at, delay_ms) = match when {
            DeliverAt::At(at) => (Some(at), None),
            DeliverAt::In(d) => (None, Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))),
        };
        let body = serde_json::to_vec(&PublishBodyRef { data, meta, deliver_at, delay_ms })
            .map_err(|e| ClientError::Config(format!("publish body does not serialise: {e}")))?;
        let resp = self.publish_raw(channel, body, idempotency_key).await?.error_for_status()?;
        let ScheduledReceipt { scheduled_id, channel, deliver_at } = serde_json::from_slice(&resp.body)
            .map_err(|e| ClientError::Protocol(format!("unexpected schedule response: {e}")))?;
        let replayed = resp.header("idempotent-replayed").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        Ok(ScheduledResult { scheduled_id, channel, deliver_at, replayed })
    }

    /// `POST /api/v1/messages`: many messages in one request, each with its
    /// own channel, `data`, `meta`, idempotency key and schedule. One
    /// result per message, in order: a refused message is its own
    /// [`MessageResult::Failed`], never an `Err` here (that is for a request
    /// refused whole: malformed, over `publish.max_batch_messages`, or not
    /// answered). Retrying the whole request after a partial failure is
    /// safe for the keyed messages: they replay instead of appending again.
    pub async fn publish_messages(
        &self,
        messages: Vec<MessageItem>,
    ) -> Result<Vec<MessageResult>, ClientError> {
        let body = serde_json::to_vec(&MessagesBody { messages })
            .map_err(|e| ClientError::Config(format!("messages body does not serialise: {e}")))?;
        let headers = [("content-type", "application/json")];
        let resp = self
            .request(Method::POST, "/api/v1/messages", &headers, Some(body.into()))
            .await?
            .error_for_status()?;
        let reply: MessagesReply = serde_json::from_slice(&resp.body)
            .map_err(|e| ClientError::Protocol(format!("unexpected messages response: {e}")))?;
        Ok(reply.results)
    }

    /// `GET /api/v1/scheduled?channel=C&limit=N`: pending schedules of a
    /// channel, in delivery order.
    pub async fn scheduled(
        &self,
        channel: &str,
        limit: Option<u32>,
    ) -> Result<Vec<ScheduledEntry>, ClientError> {
        let mut path = format!("/api/v1/scheduled?channel={}", encode_path_segment(channel));
        if let Some(limit) = limit {
            path.push_str(&format!("&limit={limit}"));
        }
        let resp = self.request(Method::GET, &path, &[], None).await?.error_for_status()?;
        let list: ScheduledList = serde_json::from_slice(&resp.body)
            .map_err(|e| ClientError::Protocol(format!("unexpected scheduled list: {e}")))?;
        Ok(list.scheduled)
    }

    /// `DELETE /api/v1/scheduled/{id}`: `Ok(None)` when there is no pending
    /// schedule with this id (never made, delivered or cancelled).
    pub async fn cancel_scheduled(&self, id: &str) -> Result<Option<ScheduledEntry>, ClientError> {
        let path = format!("/api/v1/scheduled/{}", encode_path_segment(id));
        let resp = self.request(Method::DELETE, &path, &[], None).await?;
        if resp.status == 404 {
            return Ok(None);
        }
        let resp = resp.error_for_status()?;
        serde_json::from_slice(&resp.body)
            .map(Some)
            .map_err(|e| ClientError::Protocol(format!("unexpected cancel response: {e}")))
    }

    /// Publish with a body given byte for byte (malformed bodies, exact
    /// replays); returns whatever the server answered.
    pub async fn publish_raw(
        &self,
        channel: &str,
        body: impl Into<Bytes>,
        idempotency_key: Option<&str>,
    ) -> Result<RawResponse, ClientError> {
        let path = format!("/api/v1/channels/{}/messages", encode_path_segment(channel));
        let mut headers = vec![("content-type", "application/json")];
        if let Some(key) = idempotency_key {
            headers.push(("idempotency-key", key));
        }
        self.request(Method::POST, &path, &headers, Some(body.into())).await
    }

    /// `GET /api/v1/channels/{channel}/messages?after=SEQ&limit=N`.
    pub async fn history(
        &self,
        channel: &str,
        after: Option<u64>,
        limit: Option<u32>,
    ) -> Result<History, ClientError> {
        let resp = self.history_raw(channel, after, limit).await?.error_for_status()?;
        serde_json::from_slice(&resp.body)
            .map_err(|e| ClientError::Protocol(format!("unexpected history response: {e}")))
    }

    /// [`HttpApi::history`] without interpreting the response.
    pub async fn history_raw(
        &self,
        channel: &str,
        after: Option<u64>,
        limit: Option<u32>,
    ) -> Result<RawResponse, ClientError> {
        let mut path = format!("/api/v1/channels/{}/messages", encode_path_segment(channel));
        let mut sep = '?';
        if let Some(after) = after {
            path.push_str(&format!("{sep}after={after}"));
            sep = '&';
        }
        if let Some(limit) = limit {
            path.push_str(&format!("{sep}limit={limit}"));
        }
        self.request(Method::GET, &path, &[], None).await
    }

    /// `GET path` (e.g. `/healthz`, `/metrics`).
    pub async fn get(&self, path: &str) -> Result<RawResponse, ClientError> {
        self.request(Method::GET, path, &[], None).await
    }

    /// Any request. `path` is appended to the base URL and may carry a
    /// query. The API key is sent unless `headers` has its own
    /// `Authorization`.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Bytes>,
    ) -> Result<RawResponse, ClientError> {
        let url = format!("{}{}", self.base, path);
        let mut req = self.http.request(method, url);
        let has_auth = headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("authorization"));
        if let (Some(key), false) = (&self.api_key, has_auth) {
            req = req.bearer_auth(key);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(body) = body {
            req = req.body(body);
        }
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.bytes().await?;
        Ok(RawResponse { status, headers, body })
    }
}

fn build_client() -> reqwest::Client {
    // Herald is addressed directly; a proxy from the environment would only
    // get in the way. Building without TLS does not fail in practice; the
    // fallback keeps this constructor infallible.
    reqwest::Client::builder().no_proxy().build().unwrap_or_else(|_| reqwest::Client::new())
}

fn normalise_base(base_url: &str) -> String {
    let base = base_url.trim().trim_end_matches('/');
    let base = match base.strip_prefix("ws://") {
        Some(rest) => format!("http://{rest}"),
        None if base.contains("://") => base.to_owned(),
        None => format!("http://{base}"),
    };
    // A base given as the WebSocket endpoint means the server root.
    match base.strip_suffix("/ws") {
        Some(root) => root.to_owned(),
        None => base,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_url_is_normalised() {
        assert_eq!(normalise_base("http://127.0.0.1:8080/"), "http://127.0.0.1:8080");
        assert_eq!(normalise_base("ws://h:1/ws"), "http://h:1");
        assert_eq!(normalise_base("h:1"), "http://h:1");
        assert_eq!(normalise_base("http://h/prefix"), "http://h/prefix");
    }

    #[test]
    fn publish_result_tolerates_volatile_replies() {
        let r: Published = serde_json::from_str(r#"{"channel":"typing:1","id":"x"}"#).unwrap();
        assert_eq!((r.seq, r.epoch), (None, None));
    }
}
