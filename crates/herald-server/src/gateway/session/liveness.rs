//! Proof that the peer is alive *now*: every heartbeat ping carries its
//! number, and the peer's pong echoes it. A pong echoing a ping sent after
//! some moment proves the peer was there after that moment; frames read
//! late (after this node was paused, say) prove nothing, since the peer
//! may have sent them long ago and gone since.
//!
//! Used before a member lease that expired while this node could not renew
//! is asked back: only for a connection that answered a ping sent after
//! the lease was found gone (see `requests::renew_presence`).

use bytes::Bytes;

#[derive(Debug, Default)]
pub(super) struct Liveness {
    /// Pings sent, numbered from 1.
    sent: u64,
    /// The highest ping number a pong echoed.
    echoed: u64,
}

impl Liveness {
    /// The payload of the next ping.
    pub fn next_ping(&mut self) -> Bytes {
        self.sent += 1;
        Bytes::copy_from_slice(&self.sent.to_be_bytes())
    }

    /// A pong came; `true` when it proves something new.
    pub fn on_pong(&mut self, payload: &[u8]) -> bool {
        let Ok(n) = <[u8; 8]>::try_from(payload).map(u64::from_be_bytes) else { return false };
        if n > self.echoed && n <= self.sent {
            self.echoed = n;
            true
        } else {
            false
        }
    }

    /// A mark for "from now on": the number of the next ping.
    pub fn mark(&self) -> u64 {
        self.sent + 1
    }

    /// The peer answered a ping sent after `mark` was taken.
    pub fn proven_since(&self, mark: u64) -> bool {
        self.echoed >= mark
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_echo_of_a_later_ping_proves_life() {
        let mut l = Liveness::default();
        let early = l.next_ping();
        let mark = l.mark();
        assert!(l.on_pong(&early), "an answer to an earlier ping counts as an answer");
        assert!(!l.proven_since(mark), "but not as life after the mark");
        assert!(!l.on_pong(&9u64.to_be_bytes()), "a ping never sent proves nothing");
        assert!(!l.on_pong(b"junk"), "neither does another payload");
        let later = l.next_ping();
        assert!(!l.proven_since(mark));
        assert!(l.on_pong(&later));
        assert!(l.proven_since(mark));
        assert!(!l.on_pong(&early), "old news");
    }
}
