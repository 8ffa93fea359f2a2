//! Reading a client connection in tests, every read bounded by [`WAIT`]:
//! the next frame, message, presence or room event; silence; the close.

use std::time::Duration;

use herald_client::{Connection, ServerEvent};
use herald_core::conformance::WAIT;
use herald_proto::MessageView;
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::server::TestServer;

/// The next server event; `None` when the socket closed.
pub async fn next_event(conn: &mut Connection) -> Option<ServerEvent> {
    tokio::time::timeout(WAIT, conn.next_frame()).await.expect("frame in time").expect("read")
}

/// The next text frame.
pub async fn next_frame(conn: &mut Connection) -> MessageView {
    match next_event(conn).await {
        Some(ServerEvent::Frame(v)) => v,
        other => panic!("expected a frame, got {other:?}"),
    }
}

/// The next reply (`ok` or `error`), skipping any other frame (messages
/// that arrive meanwhile).
pub async fn next_reply(conn: &mut Connection) -> MessageView {
    loop {
        match next_event(conn).await {
            Some(ServerEvent::Frame(v)) if v.kind == "ok" || v.kind == "error" => return v,
            Some(ServerEvent::Frame(_)) => continue,
            other => panic!("connection ended while waiting for a reply: {other:?}"),
        }
    }
}

/// The next `message` frame, skipping nothing else but pongs.
pub async fn next_message(conn: &mut Connection) -> MessageView {
    loop {
        match next_event(conn).await {
            Some(ServerEvent::Frame(v)) if v.kind == "message" => return v,
            Some(ServerEvent::Frame(v)) if v.kind == "pong" => continue,
            other => panic!("expected a message, got {other:?}"),
        }
    }
}

/// The next `message` frames, `n` of them, skipping nothing.
pub async fn next_messages(conn: &mut Connection, n: usize) -> Vec<MessageView> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let f = next_frame(conn).await;
        assert_eq!(f.kind, "message", "expected a message, got {f:?}");
        out.push(f);
    }
    out
}

/// Read until the socket closes; returns the frames before it and the close code.
pub async fn read_until_closed(conn: &mut Connection) -> (Vec<MessageView>, Option<u16>) {
    let mut frames = Vec::new();
    loop {
        match tokio::time::timeout(WAIT, conn.next_frame()).await.expect("close in time") {
            Ok(Some(ServerEvent::Frame(v))) => frames.push(v),
            Ok(Some(ServerEvent::Closed { code, .. })) => return (frames, code),
            Ok(None) => return (frames, None),
            Err(e) => panic!("read failed before close: {e}"),
        }
    }
}

/// Assert that no frame arrives within `d`.
pub async fn assert_silent(conn: &mut Connection, d: Duration) {
    if let Ok(r) = tokio::time::timeout(d, conn.next_frame()).await {
        panic!("expected silence, got {r:?}");
    }
}

/// Keep reading `conn` in the background (which answers the server's
/// pings, as every WebSocket client does) until it closes or the handle is
/// aborted.
pub fn keep_reading(mut conn: Connection) -> JoinHandle<()> {
    tokio::spawn(async move { while let Ok(Some(_)) = conn.next_frame().await {} })
}

/// The seqs of durable messages, in order.
pub fn seqs(msgs: &[MessageView]) -> Vec<u64> {
    msgs.iter().map(|m| m.seq.expect("durable message has a seq")).collect()
}

/// The JSON `data` of a message frame.
pub fn data(v: &MessageView) -> Value {
    serde_json::from_str(v.data.as_ref().expect("data").get()).expect("data is JSON")
}

/// Subscribe to a presence channel as member `client_id`; the `ok` reply.
pub async fn join(conn: &mut Connection, channel: &str, client_id: &str) -> MessageView {
    let ok = conn
        .request(serde_json::json!({ "type": "subscribe", "channel": channel, "client_id": client_id }))
        .await
        .expect("subscribe");
    assert_eq!(ok.kind, "ok", "{ok:?}");
    ok
}

/// The next `join` or `leave`, skipping other frames: `(kind, user, client id)`.
pub async fn next_presence(conn: &mut Connection) -> (String, String, String) {
    loop {
        let f = next_frame(conn).await;
        if f.kind == "join" || f.kind == "leave" {
            let m = f.member.expect("presence frames carry the member");
            return (f.kind, m.user, m.client_id);
        }
    }
}

/// The data of the next `room` event, skipping other frames.
pub async fn next_room_event(conn: &mut Connection) -> Value {
    loop {
        let f = next_frame(conn).await;
        if f.kind == "room" {
            return data(&f);
        }
    }
}

/// `PUT /api/v1/rooms/{room}` with `host` and `grace_period` (seconds).
pub async fn create_room<E: herald_core::Engine + 'static>(
    server: &TestServer<E>,
    room: &str,
    host: &str,
    grace_secs: u64,
) -> Value {
    let body = serde_json::json!({ "host": host, "grace_period": grace_secs });
    let r = server.call("PUT", &format!("/api/v1/rooms/{room}"), Some(body), &[]).await;
    assert_eq!(r.status, 201, "{}", r.body);
    r.body
}
