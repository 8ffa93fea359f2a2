//! Publisher-side adapters. Each publish returns only once the server
//! acknowledged it, so a sequential publisher keeps each channel in order:
//!
//! - Herald: `POST /api/v1/channels/{channel}/messages` (durable: the reply
//!   waits for the fsync), with an optional `Idempotency-Key`;
//! - the Node and socketioxide peers: `POST /publish/{channel}` with the
//!   payload as the body, answered after the fan-out (nothing stored);
//! - NATS: `PUB` on the client port followed by `PING`, acknowledged by the
//!   `PONG` (what `flush()` does in the NATS clients; nothing stored);
//! - `http201` (the HTTP ceiling): Herald's request, as is, to a server that
//!   answers every POST with 201 and does nothing else.

use anyhow::{anyhow, bail, Context};
use herald_client::HttpApi;
use herald_proto::Published;
use hyper::header::{HeaderName, AUTHORIZATION, CONTENT_TYPE};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::args::{BenchArgs, Peer};
use crate::http1::Http1;
use crate::protocol::nats;

/// The server's answer to one publish.
#[derive(Debug, Clone, Default)]
pub struct Ack {
    /// Herald's seq for the message.
    pub seq: Option<u64>,
    /// Herald answered with `Idempotent-Replayed: true`.
    pub replayed: bool,
}

/// Makes one [`Publisher`] per publishing task, each with a connection of
/// its own (`http1.rs`: one request in flight each, no pool). The Herald
/// variant also holds the Rust client's [`HttpApi`], which the scenarios use
/// outside the timed part (history, verification).
#[derive(Clone)]
pub enum PublisherFactory {
    /// `bearer`: the `Authorization` value of `--api-key`, if any.
    Herald {
        api: HttpApi,
        bearer: Option<String>,
    },
    Http {
        base: String,
    },
    Nats {
        addr: String,
    },
    /// `--peer http201`: Herald's requests, answered 201 and nothing else.
    Http201 {
        base: String,
        bearer: Option<String>,
    },
}

pub enum Publisher {
    Herald { conn: Http1, bearer: Option<String> },
    Http(Http1),
    Nats(NatsPublisher),
    Http201 { conn: Http1, bearer: Option<String> },
}

impl PublisherFactory {
    pub fn new(args: &BenchArgs) -> anyhow::Result<Self> {
        let base = args.publish_target.as_deref().unwrap_or(&args.target).trim_end_matches('/').to_owned();
        Ok(match args.peer {
            Peer::Herald => PublisherFactory::Herald {
                api: match &args.api_key {
                    Some(key) => HttpApi::new(&base, key.clone()),
                    None => HttpApi::anonymous(&base),
                },
                bearer: args.api_key.as_ref().map(|k| format!("Bearer {k}")),
            },
            Peer::Ws | Peer::Socketio | Peer::Socketioxide => PublisherFactory::Http { base },
            Peer::Nats => PublisherFactory::Nats { addr: args.nats_publish.clone() },
            Peer::Http201 => PublisherFactory::Http201 {
                base,
                bearer: args.api_key.as_ref().map(|k| format!("Bearer {k}")),
            },
        })
    }

    /// The Rust client's HTTP API of a Herald target.
    pub fn herald_api(&self) -> Option<&HttpApi> {
        match self {
            PublisherFactory::Herald { api, .. } => Some(api),
            _ => None,
        }
    }

    pub async fn connect(&self) -> anyhow::Result<Publisher> {
        Ok(match self {
            // The client's server root (a `ws://…/ws` target made `http://…`).
            PublisherFactory::Herald { api, bearer } => {
                Publisher::Herald { conn: Http1::connect(api.base_url()).await?, bearer: bearer.clone() }
            }
            PublisherFactory::Http { base } => Publisher::Http(Http1::connect(base).await?),
            PublisherFactory::Nats { addr } => Publisher::Nats(NatsPublisher::connect(addr).await?),
            PublisherFactory::Http201 { base, bearer } => {
                Publisher::Http201 { conn: Http1::connect(base).await?, bearer: bearer.clone() }
            }
        })
    }
}

impl Publisher {
    /// Publish `payload` (a JSON object) to `channel` and wait for the
    /// server's acknowledgement.
    pub async fn publish(
        &mut self,
        channel: &str,
        payload: Vec<u8>,
        idempotency_key: Option<&str>,
    ) -> anyhow::Result<Ack> {
        match self {
            Publisher::Herald { conn, bearer } => {
                let (path, body) = herald_request(channel, &payload);
                let headers = herald_headers(idempotency_key, bearer.as_deref());
                let resp = conn.post(&path, &headers, body.into()).await.context("publish request failed")?;
                if !resp.status.is_success() {
                    bail!("publish answered {}: {}", resp.status, String::from_utf8_lossy(&resp.body));
                }
                let replayed = resp
                    .headers
                    .get("idempotent-replayed")
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
                let published: Published = serde_json::from_slice(&resp.body).with_context(|| {
                    format!("unexpected publish answer: {}", String::from_utf8_lossy(&resp.body))
                })?;
                Ok(Ack { seq: published.seq, replayed })
            }
            Publisher::Http(conn) => {
                let resp = conn
                    .post_json(&format!("/publish/{channel}"), payload.into())
                    .await
                    .context("publish request failed")?;
                if !resp.status.is_success() {
                    bail!("publish answered {}: {}", resp.status, String::from_utf8_lossy(&resp.body));
                }
                Ok(Ack::default())
            }
            Publisher::Nats(nats) => {
                nats.publish(channel, &payload).await?;
                Ok(Ack::default())
            }
            Publisher::Http201 { conn, bearer } => {
                let (path, body) = herald_request(channel, &payload);
                let headers = herald_headers(idempotency_key, bearer.as_deref());
                let resp = conn.post(&path, &headers, body.into()).await.context("publish request failed")?;
                if resp.status != hyper::StatusCode::CREATED {
                    bail!(
                        "publish answered {} (want 201): {}",
                        resp.status,
                        String::from_utf8_lossy(&resp.body)
                    );
                }
                Ok(Ack::default())
            }
        }
    }
}

impl Publisher {
    /// Herald only: publish `payloads` (JSON objects) to `channel` in one
    /// `POST /api/v1/messages`, the `i`-th with `keys[i]`, and wait for the
    /// answer; one acknowledgement per message, in order. Any message's
    /// error fails the call.
    pub async fn publish_batch(
        &mut self,
        channel: &str,
        payloads: &[Vec<u8>],
        keys: &[String],
    ) -> anyhow::Result<Vec<Ack>> {
        let Publisher::Herald { conn, bearer } = self else {
            bail!("batches are Herald's `POST /api/v1/messages`");
        };
        let body = herald_batch(channel, payloads, keys);
        let headers = herald_headers(None, bearer.as_deref());
        let resp =
            conn.post("/api/v1/messages", &headers, body.into()).await.context("batch request failed")?;
        if !resp.status.is_success() {
            bail!("batch answered {}: {}", resp.status, String::from_utf8_lossy(&resp.body));
        }
        let answer: BatchAnswer = serde_json::from_slice(&resp.body)
            .with_context(|| format!("unexpected batch answer: {}", String::from_utf8_lossy(&resp.body)))?;
        if answer.results.len() != payloads.len() {
            bail!("batch of {} answered with {} results", payloads.len(), answer.results.len());
        }
        answer
            .results
            .into_iter()
            .map(|r| match r.error {
                Some(e) => bail!("a message of the batch failed: {e}"),
                None => Ok(Ack { seq: r.seq, replayed: r.replayed }),
            })
            .collect()
    }
}

/// `POST /api/v1/messages`'s answer, as far as the bench reads it.
#[derive(serde::Deserialize)]
struct BatchAnswer {
    results: Vec<BatchResult>,
}

#[derive(serde::Deserialize)]
struct BatchResult {
    seq: Option<u64>,
    #[serde(default)]
    replayed: bool,
    error: Option<serde_json::Value>,
}

/// The body of Herald's `POST /api/v1/messages` of `payloads` (JSON
/// objects) to `channel`, each with its key.
fn herald_batch(channel: &str, payloads: &[Vec<u8>], keys: &[String]) -> Vec<u8> {
    let mut body =
        Vec::with_capacity(payloads.iter().map(|p| p.len() + channel.len() + 64).sum::<usize>() + 16);
    body.extend_from_slice(b"{\"messages\":[");
    for (i, (payload, key)) in payloads.iter().zip(keys).enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(b"{\"channel\":\"");
        body.extend_from_slice(channel.as_bytes());
        body.extend_from_slice(b"\",\"idempotency_key\":\"");
        body.extend_from_slice(key.as_bytes());
        body.extend_from_slice(b"\",\"data\":");
        body.extend_from_slice(payload);
        body.push(b'}');
    }
    body.extend_from_slice(b"]}");
    body
}

/// The path and body of Herald's publish of `payload` (a JSON object) to
/// `channel`. Channel names are letters, digits and `_-.:@=`: a path
/// segment as they are.
fn herald_request(channel: &str, payload: &[u8]) -> (String, Vec<u8>) {
    let mut body = Vec::with_capacity(payload.len() + 9);
    body.extend_from_slice(b"{\"data\":");
    body.extend_from_slice(payload);
    body.push(b'}');
    (format!("/api/v1/channels/{channel}/messages"), body)
}

/// The headers of Herald's publish: JSON, the `Idempotency-Key`, the API key.
fn herald_headers<'a>(
    idempotency_key: Option<&'a str>,
    bearer: Option<&'a str>,
) -> Vec<(HeaderName, &'a str)> {
    let mut headers = vec![(CONTENT_TYPE, "application/json")];
    if let Some(key) = idempotency_key {
        headers.push((HeaderName::from_static("idempotency-key"), key));
    }
    if let Some(bearer) = bearer {
        headers.push((AUTHORIZATION, bearer));
    }
    headers
}

/// One NATS client connection on the TCP port.
pub struct NatsPublisher {
    stream: BufReader<TcpStream>,
    line: String,
}

impl NatsPublisher {
    async fn connect(addr: &str) -> anyhow::Result<Self> {
        let stream =
            TcpStream::connect(addr).await.with_context(|| format!("cannot connect to NATS at {addr}"))?;
        stream.set_nodelay(true)?;
        let mut me = NatsPublisher { stream: BufReader::new(stream), line: String::new() };
        me.read_line().await?;
        if !me.line.starts_with("INFO ") {
            bail!("expected INFO from NATS, got {}", me.line.trim_end());
        }
        let hello = format!("{}\r\nPING\r\n", nats::CONNECT);
        me.stream.get_mut().write_all(hello.as_bytes()).await?;
        me.wait_pong().await?;
        Ok(me)
    }

    async fn publish(&mut self, channel: &str, payload: &[u8]) -> anyhow::Result<()> {
        let mut frame = format!("PUB {} {}\r\n", nats::subject(channel), payload.len()).into_bytes();
        frame.extend_from_slice(payload);
        frame.extend_from_slice(b"\r\nPING\r\n");
        self.stream.get_mut().write_all(&frame).await.context("NATS write failed")?;
        self.wait_pong().await
    }

    async fn wait_pong(&mut self) -> anyhow::Result<()> {
        loop {
            self.read_line().await?;
            match self.line.trim_end() {
                "PONG" => return Ok(()),
                "PING" => self.stream.get_mut().write_all(b"PONG\r\n").await?,
                "+OK" => {}
                l if l.starts_with("INFO ") => {}
                l => bail!("NATS answered: {l}"),
            }
        }
    }

    async fn read_line(&mut self) -> anyhow::Result<()> {
        self.line.clear();
        let n = self.stream.read_line(&mut self.line).await.context("NATS read failed")?;
        if n == 0 {
            return Err(anyhow!("NATS closed the connection"));
        }
        Ok(())
    }
}

/// The server version from a NATS server's INFO line.
pub async fn nats_version(addr: &str) -> anyhow::Result<String> {
    let stream = TcpStream::connect(addr).await?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    tokio::time::timeout(std::time::Duration::from_secs(5), reader.read_line(&mut line)).await??;
    let info: serde_json::Value = serde_json::from_str(line.trim_end().trim_start_matches("INFO ").trim())?;
    info.get("version")
        .and_then(|v| v.as_str())
        .map(|v| format!("nats-server {v}"))
        .context("no version in INFO")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http201_sends_heralds_publish_request() {
        let (path, body) = herald_request("chat:r-p0", br#"{"n":1}"#);
        assert_eq!(path, "/api/v1/channels/chat:r-p0/messages");
        assert_eq!(body, br#"{"data":{"n":1}}"#);
        let headers = herald_headers(Some("r-0-0"), None);
        let names: Vec<&str> = headers.iter().map(|(h, _)| h.as_str()).collect();
        assert_eq!(names, ["content-type", "idempotency-key"]);
        assert_eq!(herald_headers(None, Some("Bearer k")).last().unwrap().1, "Bearer k");
    }

    #[test]
    fn a_batch_is_one_messages_request_of_keyed_messages() {
        let body = herald_batch(
            "chat:b",
            &[br#"{"n":1}"#.to_vec(), br#"{"n":2}"#.to_vec()],
            &["k1".into(), "k2".into()],
        );
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"messages": [
                {"channel": "chat:b", "idempotency_key": "k1", "data": {"n": 1}},
                {"channel": "chat:b", "idempotency_key": "k2", "data": {"n": 2}},
            ]})
        );
    }
}
