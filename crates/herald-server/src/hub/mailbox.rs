//! One connection's mailbox: what the hub and the rest of the server hold
//! of a session, and all they can do to it (see [`Mailbox`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures_util::task::{ArcWake, AtomicWaker};
use herald_core::QueuedLen;

use super::Outgoing;

/// Why a session must end now (see [`Mailbox::poll_stop`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The server is shutting down ([`Sessions::stop_all`](super::Sessions::stop_all)).
    Shutdown,
    /// The connection fell too far behind ([`Mailbox::kick`]).
    SlowConsumer,
    /// The node is draining: this connection's turn to go
    /// ([`Mailbox::drain`]).
    Drain,
    /// The backend disconnected it ([`Mailbox::disconnect`]; the code and
    /// reason in [`Mailbox::closing`]).
    Backend,
}

/// How the backend closes a connection ([`Mailbox::disconnect`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closing {
    /// One of Herald's close codes (`herald_proto::close`).
    pub code: u16,
    pub reason: Arc<str>,
    pub reconnect: bool,
}

/// What the backend asks a session to do besides closing (see
/// [`Mailbox::order`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Order {
    /// Subscribe the channel (from `since`, or live) and tell the client.
    Subscribe { channel: herald_proto::ChannelName, since: Option<herald_proto::Since> },
    /// End the subscription of the channel, if any, and tell the client.
    Unsubscribe { channel: herald_proto::ChannelName },
}

/// Orders a session has not taken yet, at most; one more is refused
/// (the sender logs it). Orders come from API calls, one per call and
/// connection, and a session takes them between two frames.
pub const ORDERS_MAX: usize = 64;

/// The backend's side of a mailbox, allocated on its first use.
#[derive(Default)]
struct Backend {
    orders: VecDeque<Order>,
    closing: Option<Closing>,
}

/// Bits of [`Mailbox::stop`].
const STOP_SLOW: u8 = 1;
const STOP_SHUTDOWN: u8 = 2;
const STOP_DRAIN: u8 = 4;
const STOP_BACKEND: u8 = 8;

/// One connection's mailbox, shared by its session and the server (one
/// allocation per connection). It has four roles:
///
/// - **the outbox**: a bounded queue of [`Outgoing`] messages the hub
///   pushes to without waiting and the session drains. A channel crate's
///   shared state and the hook it allocates for each wait of the receiver
///   cost an idle connection ~280 bytes; this queue allocates on the first
///   message.
/// - **the stop bits**: how the session learns it must end (a slow-consumer
///   [`kick`](Mailbox::kick), shutdown): one atomic the session reads each
///   time it is polled, woken through the outbox's waker, so a session's
///   loop takes no lock shared with other connections (a
///   `CancellationToken` or `Notify` polled by every session takes the one
///   mutex behind it on each poll).
/// - **the read waker** the session hands its socket's read side
///   ([`ArcWake`]): a wake from the socket is recorded, so the session
///   polls the socket only after it signalled
///   (`gateway/session/read_gate.rs`), at no allocation of its own.
/// - **the byte count**: bytes queued for this connection, which is how
///   far behind it is: frames in its outbox (each counted in full even when
///   shared with other connections), plus the batch or catch-up page its
///   session is writing. The hub adds, the session subtracts what it wrote.
pub struct Mailbox {
    pub queued: QueuedLen,
    /// `STOP_*` bits: why the session must end, once set never cleared.
    stop: AtomicU8,
    /// The socket's read side woke the session since the session last
    /// polled it, or its last poll yielded a frame (`gateway/session/read_gate.rs`).
    read_signalled: AtomicBool,
    /// Messages not yet taken by the session, at most `capacity`; `None`
    /// once the session ended (nothing is queued any more).
    outbox: Mutex<Option<VecDeque<Arc<Outgoing>>>>,
    capacity: usize,
    /// The session's task, waiting for the outbox, an order or a stop.
    waiting: AtomicWaker,
    /// The backend's orders and close; `None` until the first.
    backend: Mutex<Option<Box<Backend>>>,
}

/// Why [`Mailbox::push`] did not queue a message.
#[derive(Debug, PartialEq, Eq)]
pub enum PushError {
    /// The outbox holds `websocket.outbox_capacity` messages.
    Full,
    /// The session ended.
    Closed,
}

/// The waker of the socket's read side (`gateway/session/read_gate.rs`).
impl ArcWake for Mailbox {
    fn wake_by_ref(arc_self: &Arc<Self>) {
        arc_self.signal_read();
        arc_self.waiting.wake();
    }
}

impl Mailbox {
    /// A connection whose outbox holds at most `capacity` messages.
    pub fn new(capacity: usize) -> Self {
        Self {
            queued: QueuedLen::new(),
            stop: AtomicU8::new(0),
            // The first poll of the read side goes through.
            read_signalled: AtomicBool::new(true),
            outbox: Mutex::new(Some(VecDeque::new())),
            capacity,
            waiting: AtomicWaker::new(),
            backend: Mutex::new(None),
        }
    }

    /// Queue a message for the session and wake it.
    pub fn push(&self, out: Arc<Outgoing>) -> Result<(), PushError> {
        {
            let mut outbox = self.outbox.lock().expect("outbox lock poisoned");
            let queue = outbox.as_mut().ok_or(PushError::Closed)?;
            if queue.len() >= self.capacity {
                return Err(PushError::Full);
            }
            queue.push_back(out);
        }
        self.waiting.wake();
        Ok(())
    }

    /// The read side may have something: the next poll goes to the socket.
    pub fn signal_read(&self) {
        self.read_signalled.store(true, Ordering::Release);
    }

    /// Whether the read side signalled since the last call; clears the
    /// signal, so a wake from here on sets it again.
    pub fn take_read_signal(&self) -> bool {
        self.read_signalled.swap(false, Ordering::AcqRel)
    }

    /// The next queued message, if any.
    pub fn pop(&self) -> Option<Arc<Outgoing>> {
        self.outbox.lock().expect("outbox lock poisoned").as_mut()?.pop_front()
    }

    /// Messages queued now.
    pub fn outbox_len(&self) -> usize {
        self.outbox.lock().expect("outbox lock poisoned").as_ref().map_or(0, VecDeque::len)
    }

    /// The next message, once there is one (for one waiter: the session).
    pub fn poll_pop(&self, cx: &mut Context<'_>) -> Poll<Arc<Outgoing>> {
        if let Some(out) = self.pop() {
            return Poll::Ready(out);
        }
        self.waiting.register(cx.waker());
        // A push between the first look and the registration woke nobody.
        match self.pop() {
            Some(out) => Poll::Ready(out),
            None => Poll::Pending,
        }
    }

    /// Ready once the session must stop, shutdown first. For one waiter
    /// (the session), which polls it every time it is polled, so its waker
    /// is registered whenever it waits for anything.
    pub fn poll_stop(&self, cx: &mut Context<'_>) -> Poll<Stop> {
        if let Some(stop) = self.stopped() {
            return Poll::Ready(stop);
        }
        self.waiting.register(cx.waker());
        // A stop between the first look and the registration woke nobody.
        self.stopped().map_or(Poll::Pending, Poll::Ready)
    }

    fn stopped(&self) -> Option<Stop> {
        let bits = self.stop.load(Ordering::Acquire);
        if bits & STOP_SHUTDOWN != 0 {
            Some(Stop::Shutdown)
        } else if bits & STOP_BACKEND != 0 {
            Some(Stop::Backend)
        } else if bits & STOP_DRAIN != 0 {
            Some(Stop::Drain)
        } else if bits & STOP_SLOW != 0 {
            Some(Stop::SlowConsumer)
        } else {
            None
        }
    }

    /// Close the connection as a slow consumer (4008), once and for good;
    /// its session sees it in [`Mailbox::poll_stop`].
    pub fn kick(&self) {
        self.stop_with(STOP_SLOW);
    }

    pub fn is_kicked(&self) -> bool {
        self.stop.load(Ordering::Acquire) & STOP_SLOW != 0
    }

    /// Close the connection for a drain (4010: reconnect elsewhere now).
    pub(super) fn drain(&self) {
        self.stop_with(STOP_DRAIN);
    }

    /// Stop the session for shutdown ([`Sessions`](super::Sessions)).
    pub(super) fn shut_down(&self) {
        self.stop_with(STOP_SHUTDOWN);
    }

    /// Close the connection as the backend says; the first close wins.
    pub fn disconnect(&self, closing: Closing) {
        {
            let mut b = self.backend.lock().expect("backend lock poisoned");
            let b = b.get_or_insert_with(Box::default);
            if b.closing.is_none() {
                b.closing = Some(closing);
            }
        }
        self.stop_with(STOP_BACKEND);
    }

    /// The backend's close, once [`Stop::Backend`] was seen.
    pub fn closing(&self) -> Option<Closing> {
        self.backend.lock().expect("backend lock poisoned").as_ref().and_then(|b| b.closing.clone())
    }

    /// Queue an order for the session and wake it; false when
    /// [`ORDERS_MAX`] are waiting.
    pub fn order(&self, order: Order) -> bool {
        {
            let mut b = self.backend.lock().expect("backend lock poisoned");
            let b = b.get_or_insert_with(Box::default);
            if b.orders.len() >= ORDERS_MAX {
                return false;
            }
            b.orders.push_back(order);
        }
        self.waiting.wake();
        true
    }

    /// The next order, once there is one (for one waiter: the session).
    pub fn poll_order(&self, cx: &mut Context<'_>) -> Poll<Order> {
        let pop = || self.backend.lock().expect("backend lock poisoned").as_mut()?.orders.pop_front();
        if let Some(o) = pop() {
            return Poll::Ready(o);
        }
        self.waiting.register(cx.waker());
        pop().map_or(Poll::Pending, Poll::Ready)
    }

    fn stop_with(&self, bit: u8) {
        if self.stop.fetch_or(bit, Ordering::AcqRel) & bit == 0 {
            self.waiting.wake();
        }
    }

    /// The session ended: refuse further pushes and let go of what is
    /// queued (and its share of the server's ceiling) now.
    pub fn close_outbox(&self) {
        let queued = self.outbox.lock().expect("outbox lock poisoned").take();
        drop(queued);
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use prometheus_client::metrics::gauge::Gauge;

    use super::*;
    use crate::hub::tests::outgoing;
    use crate::hub::QueuedBytes;

    #[tokio::test]
    async fn the_outbox_is_bounded_in_order_and_lets_go_when_the_session_ends() {
        let queued = Arc::new(QueuedBytes::new(Gauge::default(), 1 << 20));
        let conn = Arc::new(Mailbox::new(3));
        for n in 1..=3 {
            conn.push(outgoing(n, &queued)).unwrap();
        }
        assert_eq!(conn.push(outgoing(4, &queued)), Err(PushError::Full));
        assert_eq!(conn.outbox_len(), 3);
        assert_eq!(conn.pop().unwrap().msg.ts, 1, "first in, first out");
        // A waiting session is woken by a push from another task.
        let waiter = {
            let conn = conn.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                for _ in 0..3 {
                    seen.push(poll_fn(|cx| conn.poll_pop(cx)).await.msg.ts);
                }
                seen
            })
        };
        tokio::task::yield_now().await;
        conn.push(outgoing(5, &queued)).unwrap();
        assert_eq!(waiter.await.unwrap(), [2, 3, 5]);
        // Ended: pushes are refused and what was queued is released now.
        conn.push(outgoing(6, &queued)).unwrap();
        assert_eq!(queued.total(), 10);
        conn.close_outbox();
        assert_eq!(queued.total(), 0, "the queued message's charge is released with the outbox");
        assert_eq!(conn.push(outgoing(7, &queued)), Err(PushError::Closed));
        assert!(conn.pop().is_none());
    }

    /// Orders wait in order up to `ORDERS_MAX`; the backend's first close
    /// wins and stops the session as `Stop::Backend`, shutdown still first.
    #[tokio::test]
    async fn orders_are_bounded_and_the_first_close_wins() {
        let conn = Mailbox::new(4);
        let channel = |n: usize| herald_proto::ChannelName::new(&format!("chat:{n}")).unwrap();
        for n in 0..ORDERS_MAX {
            assert!(conn.order(Order::Unsubscribe { channel: channel(n) }));
        }
        assert!(!conn.order(Order::Unsubscribe { channel: channel(999) }), "bounded");
        let first = poll_fn(|cx| conn.poll_order(cx)).await;
        assert_eq!(first, Order::Unsubscribe { channel: channel(0) });
        let closing = |code| Closing { code, reason: Arc::from("r"), reconnect: false };
        conn.disconnect(closing(4012));
        conn.disconnect(closing(4011));
        assert_eq!(poll_fn(|cx| conn.poll_stop(cx)).await, Stop::Backend);
        assert_eq!(conn.closing(), Some(closing(4012)), "the first close wins");
        conn.shut_down();
        assert_eq!(poll_fn(|cx| conn.poll_stop(cx)).await, Stop::Shutdown);
    }
}
