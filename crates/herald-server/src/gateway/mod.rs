//! The realtime gateway: the listener that accepts every connection, the
//! WebSocket upgrades (Herald's protocol on `/ws`, `ws.rs`; Centrifugo's,
//! JSON or Protobuf, on `/connection/websocket`, `wire/centrifugo/`), the
//! Server-Sent Events streams (`/sse`, `sse.rs`), the
//! wires that decode and encode each protocol (`wire/`), and the sessions
//! that serve every wire alike (`session.rs`).

pub(crate) mod listener;
pub(crate) mod session;
pub(crate) mod sse;
pub(crate) mod wire;
pub(crate) mod ws;

/// The `/connection/websocket` upgrade, where the router finds it.
pub(crate) use wire::centrifugo::upgrade as centrifugo;
