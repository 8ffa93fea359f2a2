//! The HTTP API: one module per resource, the typed extractors that check
//! a request before its handler runs, and the web console.

pub(crate) mod console;
pub(crate) mod extract;
pub(crate) mod messages;
pub(crate) mod rooms;
pub(crate) mod scheduled;
pub(crate) mod webhooks;
