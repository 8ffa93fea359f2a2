//! The realtime gateway: the listener that accepts every connection, the
//! WebSocket upgrades (Herald's protocol on `/ws`, Centrifugo's on
//! `/connection/websocket`) and the sessions that serve them.

pub(crate) mod listener;
pub(crate) mod session;
pub(crate) mod wire;
pub(crate) mod ws;

/// The `/connection/websocket` upgrade, where the router finds it.
pub(crate) use wire::centrifugo::upgrade as centrifugo;
