//! What a session writes to and reads from: an upgraded WebSocket, or the
//! body of a Server-Sent Events response. Both take what the wire encoded
//! as WebSocket messages, so the session's write path is one.
//!
//! An SSE stream is write only. Its writer gathers the payloads the session
//! feeds (a ping becomes a comment line, a close ends the body) and hands
//! them to the response body in chunks through a bounded channel: a reader
//! that does not keep up blocks the session's writes as a full socket
//! does, and the session's byte bounds and slow-consumer kick apply as
//! they do to a WebSocket. Its read side yields nothing and ends once the
//! response body is dropped (the peer went away, or the response ended).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use futures_util::{Sink, Stream};
use http_body::{Body, Frame};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::PollSender;
use tokio_websockets::{Error as WsError, Message as WsMessage};

use super::Ws;

/// A chunk of an SSE stream is handed to the body once it holds this many
/// bytes (and at every flush).
const SSE_CHUNK: usize = 64 * 1024;
/// Chunks in flight between a stream's writer and its body.
const SSE_CHUNKS_IN_FLIGHT: usize = 4;

/// See the module docs. Unboxed: the session holds its socket inline,
/// and the WebSocket, the larger, is the common one.
#[allow(clippy::large_enum_variant)]
pub enum Socket {
    Ws(Ws),
    Sse(SseWriter),
}

/// The session's side of an SSE response.
pub struct SseWriter {
    /// Written, not yet handed to the body.
    buf: BytesMut,
    tx: PollSender<Bytes>,
    /// Its receiver is in the body: closed once the body is dropped.
    body_alive: oneshot::Sender<()>,
    /// A close was fed: the next flush ends the body.
    closing: bool,
}

/// The response body of an SSE stream.
pub struct SseBody {
    rx: mpsc::Receiver<Bytes>,
    _alive: oneshot::Receiver<()>,
}

/// A stream's writer and its body, the writer holding `first` (the
/// stream's opening bytes) to send at its first flush.
pub fn sse_pipe(first: &[u8]) -> (SseWriter, SseBody) {
    let (tx, rx) = mpsc::channel(SSE_CHUNKS_IN_FLIGHT);
    let (alive_tx, alive_rx) = oneshot::channel();
    let writer = SseWriter {
        buf: BytesMut::from(first),
        tx: PollSender::new(tx),
        body_alive: alive_tx,
        closing: false,
    };
    (writer, SseBody { rx, _alive: alive_rx })
}

impl SseWriter {
    /// Hand what is written to the body (waiting for room in the channel).
    fn poll_push(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), WsError>> {
        if !self.buf.is_empty() {
            ready!(self.tx.poll_reserve(cx)).map_err(|_| WsError::AlreadyClosed)?;
            // Taken whole: an idle stream holds no buffer.
            let chunk = std::mem::take(&mut self.buf).freeze();
            self.tx.send_item(chunk).map_err(|_| WsError::AlreadyClosed)?;
        }
        if self.closing {
            self.tx.close();
        }
        Poll::Ready(Ok(()))
    }
}

impl Sink<WsMessage> for SseWriter {
    type Error = WsError;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), WsError>> {
        let this = self.get_mut();
        if this.tx.is_closed() {
            return Poll::Ready(Err(WsError::AlreadyClosed));
        }
        if this.buf.len() >= SSE_CHUNK {
            return this.poll_push(cx);
        }
        Poll::Ready(Ok(()))
    }

    fn start_send(self: Pin<&mut Self>, item: WsMessage) -> Result<(), WsError> {
        let this = self.get_mut();
        if item.is_ping() {
            this.buf.extend_from_slice(crate::gateway::wire::sse::PING);
        } else if item.is_close() {
            this.closing = true;
        } else if !item.is_pong() {
            this.buf.extend_from_slice(item.as_payload());
        }
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), WsError>> {
        self.get_mut().poll_push(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), WsError>> {
        let this = self.get_mut();
        this.closing = true;
        this.poll_push(cx)
    }
}

impl Stream for SseWriter {
    type Item = Result<WsMessage, WsError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        ready!(self.get_mut().body_alive.poll_closed(cx));
        Poll::Ready(None)
    }
}

impl Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.get_mut().rx.poll_recv(cx).map(|chunk| chunk.map(|c| Ok(Frame::data(c))))
    }
}

impl Stream for Socket {
    type Item = Result<WsMessage, WsError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.get_mut() {
            Socket::Ws(ws) => Pin::new(ws).poll_next(cx),
            Socket::Sse(sse) => Pin::new(sse).poll_next(cx),
        }
    }
}

impl Sink<WsMessage> for Socket {
    type Error = WsError;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), WsError>> {
        match self.get_mut() {
            Socket::Ws(ws) => Pin::new(ws).poll_ready(cx),
            Socket::Sse(sse) => Pin::new(sse).poll_ready(cx),
        }
    }

    fn start_send(self: Pin<&mut Self>, item: WsMessage) -> Result<(), WsError> {
        match self.get_mut() {
            Socket::Ws(ws) => Pin::new(ws).start_send(item),
            Socket::Sse(sse) => Pin::new(sse).start_send(item),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), WsError>> {
        match self.get_mut() {
            Socket::Ws(ws) => Pin::new(ws).poll_flush(cx),
            Socket::Sse(sse) => Pin::new(sse).poll_flush(cx),
        }
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), WsError>> {
        match self.get_mut() {
            Socket::Ws(ws) => Pin::new(ws).poll_close(cx),
            Socket::Sse(sse) => Pin::new(sse).poll_close(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::{SinkExt, StreamExt};
    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test]
    async fn writes_reach_the_body_in_order_and_a_close_ends_it() {
        let (mut w, mut body) = sse_pipe(b"retry: 5\n\n");
        w.feed(WsMessage::binary(Bytes::from_static(b"data: 1\n\n"))).await.unwrap();
        w.feed(WsMessage::ping(Bytes::from_static(b"p"))).await.unwrap();
        w.flush().await.unwrap();
        let chunk = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&chunk[..], b"retry: 5\n\ndata: 1\n\n:\n\n");
        w.send(WsMessage::close(None, "")).await.unwrap();
        assert!(body.frame().await.is_none(), "the close ends the body");
    }

    #[tokio::test]
    async fn a_reader_that_does_not_read_blocks_the_writer() {
        let (mut w, body) = sse_pipe(b"");
        let big = Bytes::from(vec![b'x'; SSE_CHUNK]);
        for _ in 0..SSE_CHUNKS_IN_FLIGHT {
            w.send(WsMessage::binary(big.clone())).await.unwrap();
        }
        let blocked = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            w.send(WsMessage::binary(big.clone())),
        )
        .await;
        assert!(blocked.is_err(), "the channel is full: the write waits");
        drop(body);
        assert!(w.send(WsMessage::binary(big)).await.is_err(), "the body is gone: writes fail");
        assert!(w.next().await.is_none(), "the read side ends with the body");
    }
}
