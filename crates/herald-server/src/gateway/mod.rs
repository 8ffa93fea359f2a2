//! The realtime gateway: the listener that accepts every connection, the
//! WebSocket upgrades (Herald's protocol on `/ws`, Centrifugo's on
//! `/connection/websocket`) and the sessions that serve them.

pub(crate) mod centrifugo;
pub(crate) mod listener;
pub(crate) mod session;
pub(crate) mod ws;
