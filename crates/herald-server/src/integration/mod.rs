//! Backend integration: webhooks (the server delivers channels to a
//! backend) and proxies (the server asks a backend before it acts).

pub mod proxies;
pub mod webhooks;
