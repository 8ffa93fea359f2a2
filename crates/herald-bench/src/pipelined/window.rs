//! The bounded window of one pipelined connection: which publishes are
//! still unanswered, when each was sent, and what came back.
//!
//! Request ids are consecutive per connection. An answer names one request
//! (Herald's `ok`/`error` with its `req`, the `ws` peer's `{"ack":N}`,
//! Socket.IO's ack id) or, cumulatively, every request up to one (a NATS
//! `PONG` answers every `PUB` written before its `PING`). Answers may come
//! in any order; answering a request twice, or one never sent, is an error
//! of the server (or of the bench) and is reported, never folded into the
//! counts.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

/// An answer the window cannot account for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerError {
    /// No publish with this request id was sent.
    Unknown(u64),
    /// This request was answered before.
    Duplicate(u64),
}

impl fmt::Display for AnswerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnswerError::Unknown(req) => write!(f, "answer to req {req}, which was never sent"),
            AnswerError::Duplicate(req) => write!(f, "second answer to req {req}"),
        }
    }
}

/// Unanswered publishes of one connection, at most `cap` at a time.
#[derive(Debug)]
pub struct Window {
    cap: usize,
    /// Request id of `slots[0]`.
    base: u64,
    /// Send time of every request from `base` on; `None` once answered.
    /// The front is always unanswered (answered ones are trimmed), so the
    /// length is at most the span between the oldest unanswered request
    /// and the newest one sent.
    slots: VecDeque<Option<Instant>>,
    /// Sent and not answered.
    outstanding: usize,
    /// Answered with success.
    pub acked: u64,
    /// Answered with a refusal (the publish did not happen).
    pub refused: u64,
}

impl Window {
    /// An empty window whose first request id will be `first_req`.
    pub fn new(cap: usize, first_req: u64) -> Self {
        Window {
            cap: cap.max(1),
            base: first_req,
            slots: VecDeque::new(),
            outstanding: 0,
            acked: 0,
            refused: 0,
        }
    }

    /// Another publish may be sent.
    pub fn has_room(&self) -> bool {
        self.outstanding < self.cap
    }

    /// Sent and not yet answered.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// The id the next [`Window::send`] returns.
    pub fn next_req(&self) -> u64 {
        self.base + self.slots.len() as u64
    }

    /// Record a publish sent at `at`; returns its request id. The caller
    /// checks [`Window::has_room`] first: the window never holds more than
    /// `cap` unanswered publishes.
    pub fn send(&mut self, at: Instant) -> u64 {
        debug_assert!(self.has_room(), "send past the window");
        let req = self.next_req();
        if self.slots.is_empty() {
            // Everything before was answered: restart the span here.
            self.base = req;
        }
        self.slots.push_back(Some(at));
        self.outstanding += 1;
        req
    }

    /// Request `req` was answered at `at` (`ok`: the publish happened, or
    /// was refused); returns how long it was in flight.
    pub fn answer(&mut self, req: u64, ok: bool, at: Instant) -> Result<Duration, AnswerError> {
        if req >= self.next_req() {
            return Err(AnswerError::Unknown(req));
        }
        let sent = match req.checked_sub(self.base).and_then(|i| self.slots.get_mut(i as usize)) {
            Some(slot) => slot.take().ok_or(AnswerError::Duplicate(req))?,
            // Below the span: answered (and trimmed) earlier.
            None => return Err(AnswerError::Duplicate(req)),
        };
        self.outstanding -= 1;
        if ok {
            self.acked += 1;
        } else {
            self.refused += 1;
        }
        self.trim();
        Ok(at.saturating_duration_since(sent))
    }

    /// Every request up to and including `req` was acknowledged at `at`;
    /// `each` gets the time in flight of every newly acknowledged one.
    /// Returns how many that was (a cumulative answer may cover nothing
    /// new).
    pub fn answer_through(
        &mut self,
        req: u64,
        at: Instant,
        mut each: impl FnMut(Duration),
    ) -> Result<u64, AnswerError> {
        if req >= self.next_req() {
            return Err(AnswerError::Unknown(req));
        }
        let Some(upto) = req.checked_sub(self.base) else { return Ok(0) };
        let mut count = 0;
        for slot in self.slots.iter_mut().take(upto as usize + 1) {
            if let Some(sent) = slot.take() {
                each(at.saturating_duration_since(sent));
                count += 1;
            }
        }
        self.outstanding -= count as usize;
        self.acked += count;
        self.trim();
        Ok(count)
    }

    fn trim(&mut self) {
        while let Some(None) = self.slots.front() {
            self.slots.pop_front();
            self.base += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn holds_at_most_cap_unanswered_and_frees_room_per_answer() {
        let t0 = Instant::now();
        let mut w = Window::new(3, 1);
        let reqs: Vec<u64> = (0..3).map(|i| w.send(t0 + ms(i))).collect();
        assert_eq!(reqs, vec![1, 2, 3]);
        assert!(!w.has_room());
        assert_eq!(w.answer(2, true, t0 + ms(10)), Ok(ms(9)));
        assert!(w.has_room());
        assert_eq!((w.outstanding(), w.acked, w.refused), (2, 1, 0));
        assert_eq!(w.send(t0 + ms(11)), 4);
        assert!(!w.has_room());
    }

    #[test]
    fn answers_in_any_order_and_refusals_are_counted_apart() {
        let t0 = Instant::now();
        let mut w = Window::new(10, 7);
        for i in 0..4 {
            w.send(t0 + ms(i));
        }
        assert_eq!(w.answer(10, true, t0 + ms(5)), Ok(ms(2)));
        assert_eq!(w.answer(8, false, t0 + ms(5)), Ok(ms(4)));
        assert_eq!(w.answer(7, true, t0 + ms(5)), Ok(ms(5)));
        assert_eq!(w.answer(9, true, t0 + ms(6)), Ok(ms(4)));
        assert_eq!((w.outstanding(), w.acked, w.refused), (0, 3, 1));
        assert_eq!(w.next_req(), 11, "ids keep counting after the window emptied");
    }

    #[test]
    fn duplicate_and_unknown_answers_are_errors_and_change_nothing() {
        let t0 = Instant::now();
        let mut w = Window::new(10, 1);
        w.send(t0);
        w.send(t0);
        assert_eq!(w.answer(3, true, t0), Err(AnswerError::Unknown(3)));
        assert!(w.answer(2, true, t0).is_ok());
        assert_eq!(w.answer(2, true, t0), Err(AnswerError::Duplicate(2)));
        assert!(w.answer(1, true, t0).is_ok());
        // 1 and 2 are trimmed now: still a duplicate, not unknown.
        assert_eq!(w.answer(1, false, t0), Err(AnswerError::Duplicate(1)));
        assert_eq!(w.answer(0, true, t0), Err(AnswerError::Duplicate(0)));
        assert_eq!((w.outstanding(), w.acked, w.refused), (0, 2, 0));
    }

    #[test]
    fn cumulative_answers_cover_everything_up_to_their_request() {
        let t0 = Instant::now();
        let mut w = Window::new(100, 1);
        for i in 0..5 {
            w.send(t0 + ms(i));
        }
        // One acknowledged on its own first (a mix never happens in one
        // protocol, but the accounting must not double count).
        w.answer(2, true, t0 + ms(5)).unwrap();
        let mut lat = Vec::new();
        assert_eq!(w.answer_through(3, t0 + ms(10), |d| lat.push(d)), Ok(2));
        assert_eq!(lat, vec![ms(10), ms(8)]);
        assert_eq!(w.answer_through(3, t0 + ms(11), |_| panic!("nothing new")), Ok(0));
        assert_eq!(w.answer_through(1, t0 + ms(11), |_| panic!("nothing new")), Ok(0));
        assert_eq!(w.answer_through(9, t0, |_| {}), Err(AnswerError::Unknown(9)));
        assert_eq!((w.outstanding(), w.acked), (2, 3));
        assert_eq!(w.answer_through(5, t0 + ms(12), |_| {}), Ok(2));
        assert_eq!((w.outstanding(), w.acked, w.has_room()), (0, 5, true));
    }
}
