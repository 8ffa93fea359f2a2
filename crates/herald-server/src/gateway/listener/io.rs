//! The socket as hyper sees it: reports reads and writes to the connection's
//! phase clock, and turns hyper's own answer to a request it cannot parse
//! into a problem document.
//!
//! hyper answers a malformed head (a control byte in a header, a bad request
//! line: 400) or an oversized one (431) itself, with an empty body, and
//! offers no hook to shape that answer. It writes it as one head with no
//! body (`content-length: 0`, `date`, maybe `connection: close`), while the
//! connection is reading a head (no request dispatched since its first
//! byte), and closes the connection after it. Every answer of ours at those
//! statuses has a body, so a write of exactly that shape in that phase can
//! only be hyper's: it is replaced by the same status with a problem
//! document (`bad_request`, `headers_too_large`). Anything else passes
//! through untouched; after a 101 the wrapper only forwards bytes.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use herald_proto::{ErrorCode, Problem};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::Conn;

/// Longest head hyper's own error answer can be (status line, content-length,
/// date, connection); longer writes are never inspected.
const MAX_AUTO_ANSWER: usize = 256;

pub(crate) struct GuardedIo<T> {
    inner: T,
    /// Let go once the connection is upgraded: its clock and eviction are
    /// over, and a WebSocket lives long (an idle one keeps nothing it
    /// does not need).
    conn: Option<Arc<Conn>>,
    /// The replacement answer, still to be written.
    pending: Option<Bytes>,
    /// Bytes read from `inner` before hyper took the connection (to tell
    /// HTTP/2 from HTTP/1.1): hyper reads them first.
    prefix: Bytes,
}

impl<T> GuardedIo<T> {
    /// `prefix`: bytes already read from `inner`, already reported to
    /// `conn`.
    pub fn with_prefix(inner: T, conn: Arc<Conn>, prefix: Bytes) -> Self {
        GuardedIo { inner, conn: Some(conn), pending: None, prefix }
    }

    /// The connection, until it is upgraded (then `None`, for good).
    fn conn(&mut self) -> Option<&Conn> {
        if self.conn.as_ref().is_some_and(|c| c.upgraded()) {
            self.conn = None;
        }
        self.conn.as_deref()
    }
}

impl<T: AsyncWrite + Unpin> GuardedIo<T> {
    /// Write out the replacement answer before anything else.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some(p) = &mut self.pending {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, p))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            p.advance(n);
            if p.is_empty() {
                self.pending = None;
            }
        }
        Poll::Ready(Ok(()))
    }

    /// If `head` is hyper's own error answer, queue its replacement and
    /// report it written.
    fn replace(&mut self, head: &[u8], cx: &mut Context<'_>) -> Option<io::Result<usize>> {
        let answer = problem_answer(head)?;
        self.pending = Some(answer);
        // Pending is fine: the caller flushes next, which finishes it.
        match self.poll_pending(cx) {
            Poll::Ready(Err(e)) => Some(Err(e)),
            _ => Some(Ok(head.len())),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for GuardedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix.split_to(n));
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            if let Some(conn) = self.conn() {
                conn.on_read();
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for GuardedIo<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let Some(reading_head) = this.conn().map(Conn::reading_head) else {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        };
        ready!(this.poll_pending(cx))?;
        if reading_head && buf.len() <= MAX_AUTO_ANSWER {
            if let Some(r) = this.replace(buf, cx) {
                return Poll::Ready(r);
            }
        }
        let n = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        if let Some(conn) = this.conn().filter(|_| n > 0) {
            conn.on_write();
        }
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let Some(reading_head) = this.conn().map(Conn::reading_head) else {
            return Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        };
        ready!(this.poll_pending(cx))?;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if reading_head && total <= MAX_AUTO_ANSWER {
            let flat: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            if let Some(r) = this.replace(&flat, cx) {
                return Poll::Ready(r);
            }
        }
        let n = ready!(Pin::new(&mut this.inner).poll_write_vectored(cx, bufs))?;
        if let Some(conn) = this.conn().filter(|_| n > 0) {
            conn.on_write();
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The problem-document answer replacing `head`, if `head` is exactly one
/// of hyper's own bodiless error answers.
pub(crate) fn problem_answer(head: &[u8]) -> Option<Bytes> {
    let head = std::str::from_utf8(head).ok()?.strip_suffix("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let (version, rest) = status_line.split_once(' ')?;
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    let (status, detail) = match rest.split(' ').next()? {
        "400" => (
            ErrorCode::BadRequest,
            "the request is not valid HTTP/1.1 (request line or a header: a control character, a bad name)",
        ),
        "431" => (ErrorCode::HeadersTooLarge, "the request line and headers exceed http.max_header_bytes"),
        _ => return None,
    };
    let mut date = None;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        let value = value.trim();
        match name.to_ascii_lowercase().as_str() {
            "content-length" if value == "0" => {}
            "connection" if value.eq_ignore_ascii_case("close") => {}
            "date" => date = Some(value),
            _ => return None,
        }
    }
    let body = serde_json::to_vec(&Problem::new(status, detail)).expect("problem serialises");
    let mut out = format!(
        "{version} {} {}\r\ncontent-type: application/problem+json\r\ncontent-length: {}\r\n\
         connection: close\r\nx-content-type-options: nosniff\r\ncache-control: no-store\r\n",
        status.http_status(),
        rest.split_once(' ').map_or("", |(_, reason)| reason),
        body.len(),
    );
    if let Some(d) = date {
        out.push_str("date: ");
        out.push_str(d);
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(&body);
    Some(Bytes::from(out))
}
