//! The socket's read side is polled only after the socket signalled it.
//!
//! A session's task wakes for many reasons: a message in its outbox, an
//! engine answer, a timer, a read. Each wake polls every branch of its
//! `select!` again, and polling the WebSocket's read side when nothing came
//! is not free: the stream takes a read buffer, asks the codec, asks the
//! socket for readiness and lets the buffer go again (~800 instructions).
//! On a connection that only receives (a fan-out subscriber) that was
//! about a fifth of each delivery's CPU in user space.
//!
//! The gate polls the stream with a waker of its own, which records that
//! the stream woke the task before waking it. Until that happens (or the
//! stream last returned an item, after which more may be buffered), the
//! read branch is `Pending` without touching the stream; the task's own
//! waker is kept current on every poll, so the stream's signal always
//! reaches the task that polls now.
//!
//! Invariant: the stream holds the gate's waker whenever the gate is shut,
//! because the gate shuts only when a poll through it returned `Pending`
//! (which left its waker registered). A read side polled with any other
//! waker (`now_or_never`) must be followed by [`ReadGate::open`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;
use futures_util::{Stream, StreamExt};

pub(super) struct ReadGate {
    signal: Arc<Signal>,
    /// `signal` as a waker, made once.
    waker: Waker,
}

struct Signal {
    /// The stream woke us since the last poll through the gate, or that
    /// poll returned an item.
    open: AtomicBool,
    /// The task that polls the gate.
    task: AtomicWaker,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.open.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl ReadGate {
    /// Open: the first poll goes to the stream.
    pub fn new() -> Self {
        let signal = Arc::new(Signal { open: AtomicBool::new(true), task: AtomicWaker::new() });
        let waker = Waker::from(signal.clone());
        Self { signal, waker }
    }

    /// The stream's next item, polling the stream only if the gate is open.
    pub fn poll_next<S: Stream + Unpin>(
        &self,
        stream: &mut S,
        cx: &mut Context<'_>,
    ) -> Poll<Option<S::Item>> {
        self.signal.task.register(cx.waker());
        // Shut before the poll: a wake during it opens the gate again.
        if !self.signal.open.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        let polled = stream.poll_next_unpin(&mut Context::from_waker(&self.waker));
        if polled.is_ready() {
            // More may be buffered: the next poll goes to the stream.
            self.signal.open.store(true, Ordering::Release);
        }
        polled
    }

    /// The stream was polled with another waker, which it may now hold
    /// instead of the gate's: the next poll goes to the stream.
    pub fn open(&self) {
        self.signal.open.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use futures_util::task::noop_waker_ref;

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

    struct CountingWaker(AtomicUsize);
    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_stream_is_polled_again_only_after_it_signalled_or_yielded() {
        let gate = ReadGate::new();
        let mut probe = Probe { items: vec![2, 1], ..Probe::default() };
        let task = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let task_waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&task_waker);

        assert_eq!(gate.poll_next(&mut probe, &mut cx), Poll::Ready(Some(1)));
        assert_eq!(gate.poll_next(&mut probe, &mut cx), Poll::Ready(Some(2)), "after an item, polled again");
        assert!(gate.poll_next(&mut probe, &mut cx).is_pending());
        assert_eq!(probe.polls, 3);
        for _ in 0..5 {
            assert!(gate.poll_next(&mut probe, &mut cx).is_pending(), "woken by something else");
        }
        assert_eq!(probe.polls, 3, "the stream was not polled while it had said nothing");

        // The stream signals: the task is woken and the next poll reaches it.
        probe.items.push(3);
        probe.waker.take().expect("the gate's waker").wake();
        assert_eq!(task.0.load(Ordering::SeqCst), 1, "the task was woken through the gate");
        assert_eq!(gate.poll_next(&mut probe, &mut cx), Poll::Ready(Some(3)));
        assert_eq!(probe.polls, 4);

        // Polled around the gate (with a no-op waker): `open` sends the
        // next poll to the stream, which then holds the gate's waker again.
        assert!(gate.poll_next(&mut probe, &mut cx).is_pending());
        assert!(probe.poll_next_unpin(&mut Context::from_waker(noop_waker_ref())).is_pending());
        gate.open();
        assert!(gate.poll_next(&mut probe, &mut cx).is_pending());
        assert_eq!(probe.polls, 7);
        probe.items.push(4);
        probe.waker.take().expect("the gate's waker again").wake();
        assert_eq!(task.0.load(Ordering::SeqCst), 2);
        assert_eq!(gate.poll_next(&mut probe, &mut cx), Poll::Ready(Some(4)));
    }
}
