//! Backend integration: webhooks (the server delivers channels to a
//! backend), outbox consumers (the server publishes what a backend
//! committed to its database or stream) and proxies (the server asks a
//! backend before it acts).

pub mod consumers;
pub mod proxies;
pub mod webhooks;
