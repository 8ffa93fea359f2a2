//! Server-Sent Events (`GET /sse`, docs/sse.md): a write-only wire. Each
//! message is one event whose `data` is the stored frame, unchanged, and
//! whose `id` names the stream's position in every one of its channels;
//! everything else the server says is a named event.
//!
//! The id is what a browser's `EventSource` sends back as `Last-Event-ID`
//! when it reconnects, so it carries a position per channel of the stream,
//! in the order the query named them: `epoch:seq` entries joined by `,`
//! (an empty entry: no position yet, or a volatile channel). A stream of
//! one durable channel has ids such as `0191e4c2-…:42`. Positions are
//! checked like a subscribe's `since` (`Conn::parse_positions`; a seq past
//! the head is refused), so a forged id names nothing it could not ask for.

use std::fmt::Write as _;

use bytes::Bytes;
use herald_core::{Message, Seq};
use herald_proto::{ChannelName, Since};

/// Longest epoch an id entry may carry (engines make UUIDs, 36 bytes).
const MAX_EPOCH_LEN: usize = 64;
/// Longest id entry: an epoch, `:`, a seq (at most 20 digits).
const MAX_ENTRY_LEN: usize = MAX_EPOCH_LEN + 1 + 20;

/// The stream's state that belongs to the wire: its channels in query
/// order and the position last sent on each.
pub struct Conn {
    channels: Vec<ChannelName>,
    /// `(epoch, seq)` of the last message sent (or where delivery started).
    positions: Vec<Option<(Box<str>, Seq)>>,
}

/// Why a `Last-Event-ID` (or `since`) does not name positions of the stream.
#[derive(Debug, thiserror::Error)]
pub enum BadPositions {
    #[error("longer than {max} bytes, the most {channels} channel(s) need")]
    TooLong { max: usize, channels: usize },
    #[error("names {got} position(s) for the stream's {channels} channel(s)")]
    Count { got: usize, channels: usize },
    #[error("entry {index} is not `epoch:seq`, `seq` or empty")]
    Entry { index: usize },
}

impl Conn {
    pub fn new(channels: Vec<ChannelName>) -> Conn {
        let positions = vec![None; channels.len()];
        Conn { channels, positions }
    }

    /// The stream's channels, in query order.
    pub fn channels(&self) -> &[ChannelName] {
        &self.channels
    }

    /// The longest id (and so `Last-Event-ID`) of a stream of `channels`.
    pub fn max_id_len(channels: usize) -> usize {
        channels * (MAX_ENTRY_LEN + 1)
    }

    /// Read positions in the id's encoding, one entry per channel of a
    /// stream of `channels`: `epoch:seq`, a bare `seq` (any epoch), or
    /// empty (none).
    pub fn parse_positions(s: &str, channels: usize) -> Result<Vec<Option<Since>>, BadPositions> {
        let max = Conn::max_id_len(channels);
        if s.len() > max {
            return Err(BadPositions::TooLong { max, channels });
        }
        let entries: Vec<&str> = s.split(',').collect();
        if entries.len() != channels {
            return Err(BadPositions::Count { got: entries.len(), channels });
        }
        entries
            .iter()
            .enumerate()
            .map(|(index, e)| parse_entry(e).ok_or(BadPositions::Entry { index }))
            .collect()
    }

    /// Record where `channel`'s delivery stands (its subscription started
    /// after `seq` of `epoch`).
    pub fn set_position(&mut self, channel: &ChannelName, epoch: &str, seq: Seq) {
        if let Some(i) = self.channels.iter().position(|c| c == channel) {
            match &mut self.positions[i] {
                Some((e, s)) if &**e == epoch => *s = seq,
                p => *p = Some((epoch.into(), seq)),
            }
        }
    }

    /// The id of the positions as they stand; `None` while no channel has
    /// one (a stream of volatile channels has no ids).
    fn id(&self) -> Option<String> {
        if self.positions.iter().all(Option::is_none) {
            return None;
        }
        let mut id = String::with_capacity(self.positions.len() * 48);
        for (i, p) in self.positions.iter().enumerate() {
            if i > 0 {
                id.push(',');
            }
            if let Some((epoch, seq)) = p {
                let _ = write!(id, "{epoch}:{seq}");
            }
        }
        Some(id)
    }

    /// A message or presence frame as an event: app messages under the
    /// default type (a page's `onmessage`), other frames (`room`, `join`,
    /// `leave`) named by their `type`. A logged message moves its
    /// channel's position, which the event's id then carries.
    pub fn message(&mut self, msg: &Message) -> Bytes {
        let id = match msg.seq {
            Some(seq) => {
                self.set_position(&msg.channel, msg.epoch.as_str(), seq);
                self.id()
            }
            None => None,
        };
        Bytes::from(event(message_name(msg), id.as_deref(), &msg.frame))
    }

    /// Record the position a message moves, without making its event (a
    /// stream of one channel sends the event every such stream shares,
    /// [`one_channel_event`]).
    pub fn moved(&mut self, msg: &Message) {
        if let Some(seq) = msg.seq {
            self.set_position(&msg.channel, msg.epoch.as_str(), seq);
        }
    }

    /// A named event carrying the stream's positions (the `subscribed`
    /// events that open a stream: a reconnect before any message resumes
    /// from them).
    pub fn positioned(&self, name: &str, data: &[u8]) -> Vec<u8> {
        event(Some(name), self.id().as_deref(), data)
    }
}

/// The event of a message on a stream of one channel: the bytes
/// [`Conn::message`] makes there (its id is the message's `epoch:seq`), so
/// a node makes it once for all such streams.
pub fn one_channel_event(msg: &Message) -> Bytes {
    let id = msg.seq.map(|seq| format!("{}:{seq}", msg.epoch));
    Bytes::from(event(message_name(msg), id.as_deref(), &msg.frame))
}

/// App messages are the default event type; other frames are named by
/// their `type`.
fn message_name(msg: &Message) -> Option<&str> {
    match frame_type(&msg.frame) {
        Some("message") | None => None,
        Some(other) => Some(other),
    }
}

fn parse_entry(e: &str) -> Option<Option<Since>> {
    if e.is_empty() {
        return Some(None);
    }
    if e.len() > MAX_ENTRY_LEN {
        return None;
    }
    let (epoch, seq) = match e.rsplit_once(':') {
        Some((epoch, seq)) => {
            let ok = !epoch.is_empty()
                && epoch.len() <= MAX_EPOCH_LEN
                && epoch.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
            if !ok {
                return None;
            }
            (Some(epoch.to_owned()), seq)
        }
        None => (None, e),
    };
    if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let seq = seq.parse().ok()?;
    Some(Some(Since { seq, epoch }))
}

/// The `type` of a stored frame (`{"type":"message",...}`), read from its
/// start without parsing the rest.
fn frame_type(frame: &[u8]) -> Option<&str> {
    let rest = frame.strip_prefix(br#"{"type":""#)?;
    let end = rest.iter().position(|&b| b == b'"')?;
    std::str::from_utf8(&rest[..end]).ok()
}

/// One event: `event:` if named, `id:` if given, and `data` as `data:`
/// lines (a line break inside it, only ever JSON whitespace, starts
/// another `data:` line; the browser joins them with `\n`).
pub fn event(name: Option<&str>, id: Option<&str>, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + id.map_or(0, str::len) + 32);
    if let Some(name) = name {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
    }
    if let Some(id) = id {
        out.extend_from_slice(b"id: ");
        out.extend_from_slice(id.as_bytes());
        out.push(b'\n');
    }
    for line in data.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        for part in line.split(|&b| b == b'\r') {
            out.extend_from_slice(b"data: ");
            out.extend_from_slice(part);
            out.push(b'\n');
        }
    }
    out.push(b'\n');
    out
}

/// The stream's first bytes: how long a browser waits before reconnecting.
pub fn retry(ms: u128) -> Vec<u8> {
    format!("retry: {ms}\n\n").into_bytes()
}

/// A heartbeat: a comment line, which keeps proxies from timing the
/// stream out and is never an event.
pub const PING: &[u8] = b":\n\n";

#[cfg(test)]
mod tests {
    use super::*;

    fn ch(s: &str) -> ChannelName {
        ChannelName::new(s).unwrap()
    }

    #[test]
    fn ids_carry_every_channels_position_in_query_order() {
        let mut c = Conn::new(vec![ch("a:1"), ch("b:2"), ch("c:3")]);
        assert_eq!(c.id(), None, "no position yet: no id");
        c.set_position(&ch("b:2"), "E2", 7);
        assert_eq!(c.id().as_deref(), Some(",E2:7,"));
        c.set_position(&ch("a:1"), "E1", 0);
        c.set_position(&ch("b:2"), "E2", 9);
        assert_eq!(c.id().as_deref(), Some("E1:0,E2:9,"));
        let back = Conn::parse_positions(&c.id().unwrap(), 3).unwrap();
        assert_eq!(back[0], Some(Since { seq: 0, epoch: Some("E1".into()) }));
        assert_eq!(back[1], Some(Since { seq: 9, epoch: Some("E2".into()) }));
        assert_eq!(back[2], None);
    }

    #[test]
    fn positions_are_refused_when_they_do_not_fit_the_stream() {
        assert!(matches!(Conn::parse_positions("E:1,E:2", 1), Err(BadPositions::Count { got: 2, .. })));
        assert!(matches!(Conn::parse_positions("E:x", 1), Err(BadPositions::Entry { index: 0 })));
        assert!(matches!(Conn::parse_positions(":5", 1), Err(BadPositions::Entry { .. })));
        assert!(matches!(Conn::parse_positions("E\u{e9}:5", 1), Err(BadPositions::Entry { .. })));
        assert!(matches!(Conn::parse_positions("E:-5", 1), Err(BadPositions::Entry { .. })));
        assert!(matches!(
            Conn::parse_positions("E:99999999999999999999999", 1),
            Err(BadPositions::Entry { .. })
        ));
        let long = format!("{}:1", "e".repeat(200));
        assert!(matches!(Conn::parse_positions(&long, 1), Err(BadPositions::TooLong { .. })));
        assert_eq!(Conn::parse_positions("12", 1).unwrap(), vec![Some(Since { seq: 12, epoch: None })]);
        assert_eq!(Conn::parse_positions("", 1).unwrap(), vec![None]);
    }

    #[test]
    fn a_one_channel_stream_makes_the_shared_event_byte_for_byte() {
        let msg = |seq: Option<u64>, frame: &'static [u8]| Message {
            channel: ch("a:1"),
            seq,
            id: "i".into(),
            ts: 1,
            epoch: herald_core::Epoch::new("E"),
            frame: Bytes::from_static(frame),
            closes: false,
        };
        let mut c = Conn::new(vec![ch("a:1")]);
        for m in [
            msg(Some(7), br#"{"type":"message","data":1}"#),
            msg(None, br#"{"type":"join","member":{}}"#),
            msg(Some(8), br#"{"type":"room","data":{}}"#),
        ] {
            assert_eq!(c.message(&m), one_channel_event(&m));
        }
    }

    #[test]
    fn events_name_other_frames_and_split_line_breaks() {
        let e = event(None, Some("E:1"), br#"{"type":"message","data":1}"#);
        assert_eq!(e, b"id: E:1\ndata: {\"type\":\"message\",\"data\":1}\n\n");
        let e = event(Some("room"), None, b"{\"a\":\n1,\r\n\"b\":\r2}");
        assert_eq!(e, b"event: room\ndata: {\"a\":\ndata: 1,\ndata: \"b\":\ndata: 2}\n\n");
        assert_eq!(frame_type(br#"{"type":"join","member":{}}"#), Some("join"));
        assert_eq!(frame_type(b"[]"), None);
    }
}
