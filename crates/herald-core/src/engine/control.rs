//! The backend's hold on users across the deployment: bans and revocations
//! (stored, so they hold on every node and across restarts), the control
//! channel every node listens to (orders such as "disconnect this user",
//! and the answers to list queries), and the registry of nodes (leased
//! entries, so a dead node leaves the list within its lease).
//!
//! The engine carries orders as opaque bytes: what they say is the
//! server's contract. Delivery on the control channel is at most once (a
//! Redis pub/sub message can be lost while a node reconnects); what must
//! hold whatever the channel loses is stored (a ban, a revocation) and
//! checked where connections are admitted.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use super::EngineError;

/// A ban: the connections of `user` (of one `device`, or all of them when
/// `None`) are refused until `until_ms` (ms since the Unix epoch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ban {
    pub user: String,
    pub device: Option<String>,
    pub until_ms: u64,
}

/// What the engine holds against a connection of a user and device, read
/// where connections are admitted ([`Control::admission`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Admission {
    /// The latest ban in force for the user or the device, if any.
    pub banned_until_ms: Option<u64>,
    /// Tokens of the user issued before this time (ms) are refused.
    pub revoked_before_ms: Option<u64>,
}

/// One node of the deployment, as it last reported itself: the wire
/// type of `GET /api/v1/nodes`, stored by the engine as it is.
pub use herald_proto::NodeView;

/// Where the engine hands the orders it receives on the control channel.
pub trait ControlSink: Send + Sync + 'static {
    fn order(&self, order: Bytes);
}

/// The backend's hold on users (see the module docs).
#[async_trait]
pub trait Control: Send + Sync + 'static {
    /// Where orders received on the control channel go; set once, before
    /// the first [`Control::broadcast`].
    fn set_control_sink(&self, sink: Arc<dyn ControlSink>);

    /// Store `ban`. A ban already stored for the same user and device that
    /// ends later is kept (a retried or shorter ban changes nothing). A
    /// ban is forgotten once it ends.
    async fn ban(&self, ban: &Ban) -> Result<(), EngineError>;

    /// Refuse the tokens of `user` issued before `before_ms` from now on;
    /// a later time already stored is kept. Returns the time in force.
    /// Kept until cleared by a later revoke only (tokens carry no bound
    /// the engine could expire it by).
    async fn revoke(&self, user: &str, before_ms: u64) -> Result<u64, EngineError>;

    /// The ban (of the user, or of `device`) in force at `now_ms` and the
    /// revocation of `user`, in one read.
    async fn admission(
        &self,
        user: &str,
        device: Option<&str>,
        now_ms: u64,
    ) -> Result<Admission, EngineError>;

    /// Hand `order` to the [`ControlSink`] of every node of the deployment,
    /// this one included. At most once per node; a node that is cut off
    /// from the engine meanwhile misses it.
    async fn broadcast(&self, order: Bytes) -> Result<(), EngineError>;

    /// Register or refresh this node's entry, leased for `lease`: a node
    /// that stops reporting leaves [`Control::nodes`] once it ends.
    async fn node_report(&self, node: &NodeView, lease: Duration) -> Result<(), EngineError>;

    /// Remove this node's entry (a clean shutdown).
    async fn node_leave(&self, id: &str) -> Result<(), EngineError>;

    /// Every node whose lease has not ended, in id order.
    async fn nodes(&self) -> Result<Vec<NodeView>, EngineError>;
}
