//! A raw Centrifugo JSON client for the tests of the backend's actions
//! (`control_api.rs`, `multi_node/control_across_nodes.rs`).

use std::collections::VecDeque;

use futures_util::{SinkExt, StreamExt};
use herald_test_support::WAIT;
use serde_json::{json, Value};
use tokio_websockets::{MaybeTlsStream, Message, WebSocketStream};

type Socket = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

/// A raw Centrifugo JSON client.
pub struct Cf {
    ws: Socket,
    next_id: u32,
    inbox: VecDeque<Value>,
    /// The close code, once closed.
    closed_with: Option<Option<u16>>,
}

impl Cf {
    pub async fn dial(addr: std::net::SocketAddr, query: &str) -> Self {
        let url = format!("ws://{addr}/connection/websocket{query}");
        let (ws, _) =
            tokio_websockets::ClientBuilder::new().uri(&url).unwrap().connect().await.expect("dial");
        Cf { ws, next_id: 0, inbox: VecDeque::new(), closed_with: None }
    }

    /// Sends `connect` as dev user `user` (device `device`); the reply.
    pub async fn connect(addr: std::net::SocketAddr, user: &str, device: &str) -> (Self, Value) {
        let mut c = Self::dial(addr, &format!("?user={user}&device={device}")).await;
        let r = c.call(json!({ "connect": {} })).await;
        (c, r)
    }

    pub async fn call(&mut self, mut cmd: Value) -> Value {
        self.next_id += 1;
        cmd["id"] = json!(self.next_id);
        self.ws.send(Message::text(cmd.to_string())).await.expect("send");
        loop {
            // Closed instead of answering: `null` (the close code is read next).
            let Ok(v) = self.next().await else { return Value::Null };
            if v["id"] == json!(self.next_id) {
                return v;
            }
            self.inbox.push_back(v);
        }
    }

    /// The next object, or `Err(close code)` once the server closed.
    pub async fn next(&mut self) -> Result<Value, Option<u16>> {
        if let Some(code) = self.closed_with {
            return Err(code);
        }
        loop {
            if let Some(v) = self.inbox.pop_front() {
                return Ok(v);
            }
            match tokio::time::timeout(WAIT, self.ws.next()).await.expect("frame in time") {
                Some(Ok(m)) if m.is_close() => {
                    let code = m.as_close().map(|(c, _)| c.into());
                    self.closed_with = Some(code);
                    return Err(code);
                }
                Some(Ok(m)) => {
                    let Some(text) = m.as_text() else { continue };
                    for line in text.split('\n') {
                        self.inbox.push_back(serde_json::from_str(line).expect("json"));
                    }
                }
                _ => return Err(None),
            }
        }
    }

    /// The next push (pings skipped).
    pub async fn push(&mut self) -> Value {
        loop {
            let v = self.next().await.expect("a push");
            if !v["push"].is_null() {
                return v["push"].clone();
            }
        }
    }

    /// Read until the close; its code.
    pub async fn closed(&mut self) -> Option<u16> {
        loop {
            if let Err(code) = self.next().await {
                return code;
            }
        }
    }
}
