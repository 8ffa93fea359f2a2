//! Abuse tests: what one hostile or careless client
//! can do to a real server through real sockets, and what it cannot. One
//! binary, one module per area: connections (timeouts, caps, origins),
//! input (hostile data, identities, idempotency keys), session (floods,
//! slow consumers, token expiry).

mod connections;
mod input;
mod session;
