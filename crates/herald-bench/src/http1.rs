//! One HTTP/1.1 keep-alive connection per publisher, driven by the task
//! that publishes: hyper's client connection, without a pool.
//!
//! Why not the shared `reqwest` client the rest of the bench uses: with one
//! request in flight per publisher, each request went through the pool's
//! lock and two hand-offs to and from a connection task of its own, and the
//! bench's publishers used more CPU than the server's HTTP side (perf, 64
//! publishers on this 2-core machine: 44 % of a core for the client, 37 %
//! for the server's request handling). Sharing the two cores, the load
//! generator's cost is taken from the server; `wrk` with the same 64
//! connections got a quarter more publishes a second through the same
//! server. Here the request and the connection are polled by the same task:
//! no lock, no hand-off.

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::pin::Pin;
use tokio::net::TcpStream;

type Conn = http1::Connection<TokioIo<TcpStream>, Full<Bytes>>;

/// A keep-alive connection to one server.
pub struct Http1 {
    sender: http1::SendRequest<Full<Bytes>>,
    /// hyper's side of the connection: polled while a request is under way;
    /// `None` once it ended (never polled again).
    conn: Option<Pin<Box<Conn>>>,
    host: HeaderValue,
}

/// A response, read whole.
#[derive(Debug)]
pub struct Response {
    pub status: StatusCode,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

impl Http1 {
    /// Connect to the server of `base` (`http://host:port`, any path ignored).
    pub async fn connect(base: &str) -> anyhow::Result<Self> {
        let uri: Uri = base.parse().with_context(|| format!("bad server address {base}"))?;
        if uri.scheme_str().is_some_and(|s| s != "http") {
            bail!("only http:// servers: {base}");
        }
        let authority = uri.authority().ok_or_else(|| anyhow!("no host in {base}"))?.clone();
        let port = authority.port_u16().unwrap_or(80);
        let stream = TcpStream::connect((authority.host(), port))
            .await
            .with_context(|| format!("cannot connect to {authority}"))?;
        stream.set_nodelay(true)?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream)).await.context("HTTP handshake")?;
        Ok(Self { sender, conn: Some(Box::pin(conn)), host: HeaderValue::from_str(authority.as_str())? })
    }

    /// `POST path` with `body` and the given headers; the whole response.
    pub async fn post(
        &mut self,
        path: &str,
        headers: &[(HeaderName, &str)],
        body: Bytes,
    ) -> anyhow::Result<Response> {
        let mut req = Request::builder().method(Method::POST).uri(path).header(HOST, self.host.clone());
        for (name, value) in headers {
            req = req.header(name, *value);
        }
        let req = req.body(Full::new(body)).context("bad request")?;
        let Self { sender, conn, .. } = self;
        drive(conn, sender.ready()).await?.context("connection not ready")?;
        let resp = drive(conn, sender.send_request(req)).await?.context("request failed")?;
        let (parts, body) = resp.into_parts();
        let body = drive(conn, body.collect()).await?.context("response body")?.to_bytes();
        Ok(Response { status: parts.status, headers: parts.headers, body })
    }

    /// `POST path` with a JSON body.
    pub async fn post_json(&mut self, path: &str, body: Bytes) -> anyhow::Result<Response> {
        self.post(path, &[(CONTENT_TYPE, "application/json")], body).await
    }
}

/// Polls `fut` and the connection together until `fut` is done; the
/// connection ending before `fut` can finish is an error. (A response read
/// in the same poll that saw the server close is still `fut`'s.)
async fn drive<F: Future>(conn: &mut Option<Pin<Box<Conn>>>, fut: F) -> anyhow::Result<F::Output> {
    tokio::pin!(fut);
    let end = match conn.as_mut() {
        Some(running) => tokio::select! {
            biased;
            out = &mut fut => return Ok(out),
            end = running.as_mut() => end.map_err(|e| anyhow!(e).context("connection failed")),
        },
        None => Err(anyhow!("the connection has ended")),
    };
    *conn = None;
    // What the connection read before it ended (the last response of a
    // server that closes after it) is still there.
    match futures_util::FutureExt::now_or_never(fut) {
        Some(out) => Ok(out),
        None => Err(end.err().unwrap_or_else(|| anyhow!("the server closed the connection"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Two requests on one connection, answered in turn by a scripted
    /// server: the same socket, whole bodies, headers passed through.
    #[tokio::test]
    async fn keeps_the_connection_and_reads_whole_responses() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            for answer in ["201 Created", "409 Conflict"] {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                // Headers, then the 2-byte body.
                while !(got.windows(4).any(|w| w == b"\r\n\r\n") && got.ends_with(b"{}")) {
                    let n = s.read(&mut buf).await.unwrap();
                    assert!(n > 0, "client closed early");
                    got.extend_from_slice(&buf[..n]);
                }
                seen.push(String::from_utf8(got).unwrap());
                let body = format!("{{\"answer\":\"{answer}\"}}");
                let resp = format!(
                    "HTTP/1.1 {answer}\r\ncontent-length: {}\r\nx-test: yes\r\n\r\n{body}",
                    body.len()
                );
                s.write_all(resp.as_bytes()).await.unwrap();
            }
            seen
        });
        let mut c = Http1::connect(&format!("http://{addr}")).await.unwrap();
        let key = HeaderName::from_static("idempotency-key");
        let a = c.post("/a", &[(key, "k1")], Bytes::from_static(b"{}")).await.unwrap();
        assert_eq!(a.status, StatusCode::CREATED);
        assert_eq!(a.headers.get("x-test").unwrap(), "yes");
        assert_eq!(&a.body[..], br#"{"answer":"201 Created"}"#);
        let b = c.post_json("/b", Bytes::from_static(b"{}")).await.unwrap();
        assert_eq!(b.status, StatusCode::CONFLICT);
        let seen = server.await.unwrap();
        assert!(seen[0].starts_with("POST /a HTTP/1.1\r\n"), "{}", seen[0]);
        assert!(
            seen[0].contains("idempotency-key: k1\r\n") && seen[0].contains(&format!("host: {addr}\r\n"))
        );
        assert!(!seen[0].contains("content-type"), "only the headers given");
        assert!(seen[1].starts_with("POST /b HTTP/1.1\r\n") && !seen[1].contains("idempotency-key"));
        assert!(seen[1].contains("content-type: application/json\r\n"));
    }

    #[tokio::test]
    async fn a_closed_connection_is_an_error_not_a_hang() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            drop(s);
        });
        let mut c = Http1::connect(&format!("http://{addr}")).await.unwrap();
        assert!(c.post_json("/a", Bytes::from_static(b"{}")).await.is_err());
        // And so is every later request (the ended connection is not polled).
        assert!(c.post_json("/a", Bytes::from_static(b"{}")).await.is_err());
    }
}
