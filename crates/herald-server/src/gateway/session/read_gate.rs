//! The socket's read side is polled only after the socket signalled it.
//!
//! A session's task wakes for many reasons: a message in its outbox, an
//! engine answer, a timer, a read. Each wake polls every branch of its
//! `select!` again, and polling the WebSocket's read side when nothing came
//! is not free: the stream takes a read buffer, asks the codec, asks the
//! socket for readiness and lets the buffer go again (~600 instructions).
//! On a connection that only receives (a fan-out subscriber) that was
//! about a seventh of each delivery's CPU in user space.
//!
//! The read side is polled with a waker of its own: the connection's
//! [`Mailbox`], which records that the socket woke the task before it
//! wakes it (and costs no allocation: the hub's per-connection state is
//! already shared). Until that happens (or after a poll that yielded a
//! frame, when more may be buffered) the read branch is `Pending` without
//! touching the stream. The signal wakes the task whose waker the
//! connection holds: the session registers it each time it is polled
//! ([`Mailbox::poll_stop`], polled first, before its other branches), so
//! the socket's signal reaches the task that polls now.
//!
//! Invariant: the stream holds the connection's waker whenever the signal
//! is clear, because the signal is cleared only by a poll through here that
//! returned `Pending` (which left that waker registered). So every poll of
//! the read side goes through here: [`poll_next`] for the session's wait,
//! [`try_next`] for the frames already there after one (a poll with any
//! other waker would leave the stream holding that one).

use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::task::waker_ref;
use futures_util::{Stream, StreamExt};

use crate::hub::Mailbox;

/// The stream's next item, polling the stream only once it signalled
/// (see the module docs). The caller has registered its task's waker
/// with `conn` in this poll ([`Mailbox::poll_stop`]).
pub(super) fn poll_next<S: Stream + Unpin>(conn: &Arc<Mailbox>, stream: &mut S) -> Poll<Option<S::Item>> {
    // Cleared before the poll: a wake during it sets the signal again.
    if !conn.take_read_signal() {
        return Poll::Pending;
    }
    poll_stream(conn, stream)
}

/// The stream's next item if it has one now, whether or not it signalled
/// (the frames that came with the one just read); `None` leaves the stream
/// waiting with the connection's waker, as a `Pending` of [`poll_next`]
/// does.
pub(super) fn try_next<S: Stream + Unpin>(conn: &Arc<Mailbox>, stream: &mut S) -> Option<Option<S::Item>> {
    conn.take_read_signal();
    match poll_stream(conn, stream) {
        Poll::Ready(item) => Some(item),
        Poll::Pending => None,
    }
}

/// One poll of the stream with the connection's waker; the signal is clear.
fn poll_stream<S: Stream + Unpin>(conn: &Arc<Mailbox>, stream: &mut S) -> Poll<Option<S::Item>> {
    let waker = waker_ref(conn);
    let polled = stream.poll_next_unpin(&mut Context::from_waker(&waker));
    if polled.is_ready() {
        // More may be buffered: the next poll goes to the stream.
        conn.signal_read();
    }
    polled
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    use super::*;

    /// A stream that counts its polls and yields what `items` holds,
    /// keeping the last waker it was polled with.
    #[derive(Default)]
    struct Probe {
        polls: usize,
        items: Vec<u32>,
        waker: Option<Waker>,
    }

    impl Stream for Probe {
        type Item = u32;
        fn poll_next(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<u32>> {
            self.polls += 1;
            match self.items.pop() {
                Some(item) => Poll::Ready(Some(item)),
                None => {
                    self.waker = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        }
    }

    /// A poll as the session makes it: `poll_stop` first (registering the
    /// task's waker), then the read side.
    fn next(conn: &Arc<Mailbox>, probe: &mut Probe, cx: &mut Context<'_>) -> Poll<Option<u32>> {
        assert!(conn.poll_stop(cx).is_pending());
        poll_next(conn, probe)
    }

    struct CountingWaker(AtomicUsize);
    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_stream_is_polled_again_only_after_it_signalled_or_yielded() {
        let conn = Arc::new(Mailbox::new(16));
        let mut probe = Probe { items: vec![2, 1], ..Probe::default() };
        let task = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let task_waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&task_waker);

        assert_eq!(next(&conn, &mut probe, &mut cx), Poll::Ready(Some(1)));
        assert_eq!(next(&conn, &mut probe, &mut cx), Poll::Ready(Some(2)), "after an item, polled again");
        assert!(next(&conn, &mut probe, &mut cx).is_pending());
        assert_eq!(probe.polls, 3);
        for _ in 0..5 {
            assert!(next(&conn, &mut probe, &mut cx).is_pending(), "woken by something else");
        }
        assert_eq!(probe.polls, 3, "the stream was not polled while it had said nothing");

        // The stream signals: the task is woken and the next poll reaches it.
        probe.items.push(3);
        probe.waker.take().expect("the connection's waker").wake();
        assert_eq!(task.0.load(Ordering::SeqCst), 1, "the task was woken through the connection");
        assert_eq!(next(&conn, &mut probe, &mut cx), Poll::Ready(Some(3)));
        assert_eq!(probe.polls, 4);

        // After a frame, `try_next` takes what is already there and, once
        // the stream is empty, leaves it waiting with the connection's
        // waker: the gate then stays shut until the stream signals.
        probe.items.push(4);
        assert_eq!(try_next(&conn, &mut probe), Some(Some(4)));
        assert_eq!(try_next(&conn, &mut probe), None);
        assert_eq!(probe.polls, 6);
        assert!(next(&conn, &mut probe, &mut cx).is_pending());
        assert_eq!(probe.polls, 6, "no second poll to learn that nothing came");
        probe.items.push(5);
        probe.waker.take().expect("the connection's waker again").wake();
        assert_eq!(task.0.load(Ordering::SeqCst), 2);
        assert_eq!(next(&conn, &mut probe, &mut cx), Poll::Ready(Some(5)));
    }
}
