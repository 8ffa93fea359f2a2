//! The HTTP/1.1 upgrade, done by hand.
//!
//! tokio-websockets can do the upgrade itself, but on a refusal it only
//! reports the status and drops the body; Herald's refusals carry a
//! problem+json `code` the tests and callers need. So we write the request,
//! parse the response with `httparse`, and hand the stream (plus any bytes
//! read past the response head) to `ClientBuilder::take_over`.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use base64::Engine as _;
use bytes::{Buf, Bytes, BytesMut};
use herald_proto::Problem;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::url::WsTarget;
use crate::ClientError;

/// Largest response head we accept.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Most of a refusal body we read (problem documents are small).
const MAX_BODY_BYTES: usize = 64 * 1024;
/// Most of a refusal body kept in the error for display.
const MAX_BODY_IN_ERROR: usize = 2048;
/// RFC 6455 magic appended to the key before hashing.
const WS_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// Connect and upgrade. On success the returned stream is positioned at the
/// first WebSocket frame.
pub(crate) async fn upgrade(
    target: &WsTarget,
    extra_headers: &[(&str, &str)],
) -> Result<Prefixed<TcpStream>, ClientError> {
    let stream = TcpStream::connect((target.host.as_str(), target.port)).await.map_err(|e| {
        ClientError::Connect { addr: format!("{}:{}", target.host, target.port), source: e.into() }
    })?;
    upgrade_on(stream, target, extra_headers).await
}

/// Upgrade an already connected stream (the caller chose the local
/// address, socket options, ...).
pub(crate) async fn upgrade_on(
    mut stream: TcpStream,
    target: &WsTarget,
    extra_headers: &[(&str, &str)],
) -> Result<Prefixed<TcpStream>, ClientError> {
    // Frames are small and latency matters more than packet count.
    stream.set_nodelay(true)?;

    let key = make_key();
    let request = build_request(target, &key, extra_headers);
    stream.write_all(request.as_bytes()).await?;
    stream.flush().await?;

    let mut buf = BytesMut::with_capacity(1024);
    let head = loop {
        if let Some(head) = parse_head(&buf)? {
            break head;
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Err(ClientError::Handshake("response head too large".into()));
        }
        if stream.read_buf(&mut buf).await? == 0 {
            return Err(ClientError::Handshake("connection closed before the upgrade response".into()));
        }
    };
    buf.advance(head.len);

    if head.status == 101 {
        if !head.upgrade.as_deref().is_some_and(|u| u.eq_ignore_ascii_case("websocket")) {
            return Err(ClientError::Handshake("101 response without `Upgrade: websocket`".into()));
        }
        if head.accept.as_deref() != Some(expected_accept(&key).as_str()) {
            return Err(ClientError::Handshake("wrong Sec-WebSocket-Accept".into()));
        }
        // Bytes already read past the head belong to the WebSocket stream.
        return Ok(Prefixed { prefix: buf.freeze(), inner: stream });
    }

    let body = read_body(&mut stream, buf, &head).await;
    Err(rejection(head.status, &body))
}

/// Build the error for a refused upgrade from its (possibly partial) body.
fn rejection(status: u16, body: &[u8]) -> ClientError {
    let problem = serde_json::from_slice::<Problem>(body).ok().map(Box::new);
    // A body that is JSON with a `code` but not a full problem document
    // still yields the code.
    let code = problem.as_ref().map(|p| p.code.clone()).or_else(|| {
        serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("code").and_then(|c| c.as_str()).map(str::to_owned))
    });
    let shown = &body[..body.len().min(MAX_BODY_IN_ERROR)];
    ClientError::Rejected { status, code, problem, body: String::from_utf8_lossy(shown).into_owned() }
}

/// The parts of a response head we act on.
#[derive(Debug)]
struct Head {
    len: usize,
    status: u16,
    upgrade: Option<String>,
    accept: Option<String>,
    content_length: Option<usize>,
    chunked: bool,
}

fn parse_head(buf: &[u8]) -> Result<Option<Head>, ClientError> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(ClientError::Handshake(format!("bad HTTP response: {e}"))),
    };
    let status = resp.code.unwrap_or(0);
    let mut head = Head { len, status, upgrade: None, accept: None, content_length: None, chunked: false };
    for h in resp.headers.iter() {
        let value = || String::from_utf8_lossy(h.value).trim().to_owned();
        if h.name.eq_ignore_ascii_case("upgrade") {
            head.upgrade = Some(value());
        } else if h.name.eq_ignore_ascii_case("sec-websocket-accept") {
            head.accept = Some(value());
        } else if h.name.eq_ignore_ascii_case("content-length") {
            head.content_length = value().parse().ok();
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            head.chunked = value().to_ascii_lowercase().contains("chunked");
        }
    }
    Ok(Some(head))
}

/// Read a refusal body, bounded by [`MAX_BODY_BYTES`]. Best effort: an I/O
/// error ends the body early, since the status alone is still a useful error.
async fn read_body(stream: &mut TcpStream, mut buf: BytesMut, head: &Head) -> Vec<u8> {
    loop {
        if head.chunked {
            if let Some(body) = decode_chunked(&buf) {
                return body;
            }
        } else if let Some(len) = head.content_length {
            if buf.len() >= len {
                buf.truncate(len);
                return buf.to_vec();
            }
        }
        if buf.len() >= MAX_BODY_BYTES {
            break;
        }
        match stream.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    if head.chunked {
        // Incomplete chunked body: keep what decodes.
        return decode_chunked_prefix(&buf);
    }
    buf.to_vec()
}

/// Decode a complete chunked body; `None` while the terminating chunk has
/// not arrived. Trailers are ignored.
fn decode_chunked(mut buf: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = buf.windows(2).position(|w| w == b"\r\n")?;
        let size_str = std::str::from_utf8(&buf[..line_end]).ok()?;
        let size_str = size_str.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_str, 16).ok()?;
        buf = &buf[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        if buf.len() < size + 2 {
            return None;
        }
        out.extend_from_slice(&buf[..size]);
        buf = &buf[size + 2..];
    }
}

/// The complete chunks at the start of a truncated chunked body.
fn decode_chunked_prefix(mut buf: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line_end) = buf.windows(2).position(|w| w == b"\r\n") {
        let Some(size) = std::str::from_utf8(&buf[..line_end])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok())
        else {
            break;
        };
        buf = &buf[line_end + 2..];
        if size == 0 || buf.len() < size {
            break;
        }
        out.extend_from_slice(&buf[..size]);
        buf = &buf[(size + 2).min(buf.len())..];
    }
    out
}

fn make_key() -> String {
    let mut raw = [0u8; 16];
    fastrand::fill(&mut raw);
    base64::engine::general_purpose::STANDARD.encode(raw)
}

pub(crate) fn expected_accept(key: &str) -> String {
    let mut sha = sha1_smol::Sha1::new();
    sha.update(key.as_bytes());
    sha.update(WS_GUID.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(sha.digest().bytes())
}

fn build_request(target: &WsTarget, key: &str, extra_headers: &[(&str, &str)]) -> String {
    let mut req = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\
         User-Agent: herald-client/{}\r\n",
        target.path_and_query,
        target.host_header,
        env!("CARGO_PKG_VERSION"),
    );
    for (name, value) in extra_headers {
        req.push_str(name);
        req.push_str(": ");
        req.push_str(value);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    req
}

/// A stream that first yields bytes already read from it.
///
/// Invariant: `prefix` holds exactly the bytes read past the HTTP response
/// head, in order; once drained it is empty and reads go straight to
/// `inner`. An empty `Bytes` does not allocate, so the steady state costs
/// nothing per connection.
pub(crate) struct Prefixed<S> {
    prefix: Bytes,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_matches_rfc_6455_example() {
        assert_eq!(expected_accept("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert_eq!(make_key().len(), 24);
    }

    #[test]
    fn chunked_bodies_decode_when_complete() {
        assert_eq!(decode_chunked(b"4\r\nWiki\r\n5;x=y\r\npedia\r\n0\r\n\r\n").unwrap(), b"Wikipedia");
        assert_eq!(decode_chunked(b"4\r\nWiki\r\n5\r\nped"), None);
        assert_eq!(decode_chunked(b"4\r\nWiki\r\n"), None);
        assert_eq!(decode_chunked_prefix(b"4\r\nWiki\r\n5\r\nped"), b"Wiki");
    }

    #[test]
    fn rejection_keeps_problem_code() {
        let body = serde_json::to_vec(&Problem::new(herald_proto::ErrorCode::Forbidden, "nope")).unwrap();
        match rejection(403, &body) {
            ClientError::Rejected { status: 403, code: Some(code), problem: Some(p), .. } => {
                assert_eq!(code, "forbidden");
                assert_eq!(p.detail, "nope");
            }
            other => panic!("{other:?}"),
        }
        match rejection(401, br#"{"code":"unauthorized"}"#) {
            ClientError::Rejected { code: Some(code), problem: None, .. } => assert_eq!(code, "unauthorized"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(rejection(502, b"<html>"), ClientError::Rejected { code: None, .. }));
    }

    #[test]
    fn request_has_upgrade_headers_and_extras() {
        let target = WsTarget {
            host: "h".into(),
            port: 1,
            host_header: "h:1".into(),
            path_and_query: "/ws?user=a".into(),
        };
        let req = build_request(&target, "KEY", &[("Authorization", "Bearer t")]);
        assert!(req.starts_with("GET /ws?user=a HTTP/1.1\r\nHost: h:1\r\n"));
        assert!(req.contains("Sec-WebSocket-Key: KEY\r\n"));
        assert!(req.ends_with("Authorization: Bearer t\r\n\r\n"));
    }
}
