//! Client tests against scripted fake servers on 127.0.0.1:0.
//!
//! The fakes speak just enough of the protocol for each scenario; the real
//! end-to-end behaviour is covered by the server's integration tests.

mod client;
mod connection;
mod http_api;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio_websockets::{CloseCode, Message, WebSocketStream};

/// Every test body runs under this deadline, so a bug fails instead of
/// hanging.
pub(crate) async fn within<F: Future>(fut: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(10), fut).await.expect("test timed out")
}

pub(crate) struct FakeServer {
    listener: TcpListener,
    addr: SocketAddr,
}

impl FakeServer {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        Self { listener, addr }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn accept_raw(&self) -> TcpStream {
        self.listener.accept().await.expect("accept").0
    }

    pub async fn accept(&self) -> FakeConn {
        let stream = self.accept_raw().await;
        let (request, ws) = tokio_websockets::ServerBuilder::new().accept(stream).await.expect("upgrade");
        FakeConn { request, ws }
    }
}

pub(crate) struct FakeConn {
    pub request: http::Request<()>,
    ws: WebSocketStream<TcpStream>,
}

impl FakeConn {
    pub fn query(&self) -> &str {
        self.request.uri().query().unwrap_or("")
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.request.headers().get(name).and_then(|v| v.to_str().ok())
    }

    /// The next text frame as JSON; `None` when the client closed.
    pub async fn try_recv(&mut self) -> Option<Value> {
        loop {
            let msg = self.ws.next().await?.ok()?;
            if let Some(text) = msg.as_text() {
                return Some(serde_json::from_str(text).expect("client sent JSON"));
            }
            if msg.is_close() {
                return None;
            }
        }
    }

    pub async fn recv(&mut self) -> Value {
        self.try_recv().await.expect("client frame")
    }

    /// The next frame, which must be of `kind`.
    pub async fn recv_type(&mut self, kind: &str) -> Value {
        let v = self.recv().await;
        assert_eq!(v["type"], kind, "{v}");
        v
    }

    pub async fn send(&mut self, v: Value) {
        self.ws.send(Message::text(v.to_string())).await.expect("send");
    }

    /// Send a close frame and wait for the client's answer.
    pub async fn close(mut self, code: u16, reason: &str) {
        let code = CloseCode::try_from(code).expect("close code");
        let _ = self.ws.send(Message::close(Some(code), reason)).await;
        while let Some(Ok(_)) = self.ws.next().await {}
    }

    /// What Herald does before closing: a `disconnect` frame, then close.
    pub async fn disconnect(mut self, code: u16, reason: &str, reconnect: bool) {
        self.send(json!({ "type": "disconnect", "code": code, "reason": reason, "reconnect": reconnect }))
            .await;
        self.close(code, reason).await;
    }
}

/// A subscribe `ok` reply.
pub(crate) fn sub_ok(req: &Value, channel: &str, epoch: &str, first: u64, head: u64) -> Value {
    json!({
        "type": "ok", "req": req, "channel": channel,
        "epoch": epoch, "first": first, "head": head, "truncated": false,
    })
}

/// A `message` frame whose data is `{"n": seq}`.
pub(crate) fn msg(channel: &str, seq: u64) -> Value {
    json!({
        "type": "message", "channel": channel, "seq": seq,
        "id": format!("id-{seq}"), "ts": 1_700_000_000_000u64, "data": { "n": seq },
    })
}
