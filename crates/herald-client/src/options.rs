//! [`ClientOptions`]: the settings of a [`crate::Client`].

use std::time::Duration;

use crate::backoff::Backoff;
use crate::ConnectOptions;

/// Settings of a [`Client`]. [`ClientOptions::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub connect: ConnectOptions,
    /// Reconnect delays (full jitter). Default 100 ms doubling up to 10 s.
    pub backoff: Backoff,
    /// Give up after this many consecutive failed reconnects (`None`:
    /// never). A connection that delivered anything resets the count.
    pub max_reconnect_attempts: Option<u32>,
    /// How long `subscribe` and `publish` wait for the server's reply
    /// (including waiting for a connection). Default 10 s.
    pub request_timeout: Duration,
    /// After this long without any frame from the server, send a WebSocket
    /// ping. Default 30 s.
    pub ping_interval: Duration,
    /// No frame at all within this long after our ping: the connection is
    /// dead; reconnect. Default 10 s.
    pub pong_timeout: Duration,
    /// Capacity of each subscription's event queue. When it is full the
    /// client stops reading the socket (the server then treats us as a slow
    /// consumer; we resume from the last delivered seq). Default 256.
    pub event_capacity: usize,
    /// Capacity of the command queue to the background task, which also
    /// bounds publishes waiting for a connection. Default 64.
    pub command_capacity: usize,
    /// This client's member id on presence channels, sent with every
    /// subscribe and kept across reconnects, so a reconnect within the
    /// server's lease keeps the membership (no leave/join pair). Default:
    /// random per `ClientOptions`.
    pub client_id: String,
    /// Take the subscriptions the server makes (the personal channel, a
    /// `subscribed` frame) as [`crate::Subscription`]s from
    /// [`crate::Client::next_server_subscription`]. Off (the default), the
    /// client unsubscribes them at once, so nothing queues for a reader
    /// that does not exist. At most 16 wait to be taken; one more is
    /// declined the same way.
    pub server_subscriptions: bool,
}

impl ClientOptions {
    pub fn new(connect: ConnectOptions) -> Self {
        Self {
            connect,
            backoff: Backoff::default(),
            max_reconnect_attempts: None,
            request_timeout: Duration::from_secs(10),
            ping_interval: Duration::from_secs(30),
            pong_timeout: Duration::from_secs(10),
            event_capacity: 256,
            command_capacity: 64,
            client_id: format!("rc-{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..)),
            server_subscriptions: false,
        }
    }
}

impl From<ConnectOptions> for ClientOptions {
    fn from(connect: ConnectOptions) -> Self {
        Self::new(connect)
    }
}
