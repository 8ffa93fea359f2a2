//! Herald's WebSocket protocol (docs/protocol.md): `subscribe` with an
//! optional `since`, `ok` with `epoch`/`head`, then `message` frames.
//! Frames are parsed borrowed, without building a `Value`, so the client
//! spends little CPU per delivery.

use std::collections::VecDeque;

use anyhow::{anyhow, bail, Context};
use futures_util::SinkExt;
use herald_proto::{OutFrame, Since};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::time::Instant;
use tokio_websockets::Message;

use super::{clip, next_data, Incoming, ResumePoint, Subscribed, Ws, WsAuth};
use crate::payload;

const SUBSCRIBE_REQ: u64 = 1;

pub fn path(auth: &WsAuth, user: &str) -> String {
    match auth {
        WsAuth::Dev => format!("/ws?user={user}"),
        WsAuth::Token(token) => format!("/ws?token={token}&device={user}"),
    }
}

/// The `subscribe` frame, encoded by `herald-proto` like every client's.
fn subscribe_frame(channel: &str, resume: &ResumePoint) -> String {
    let since = resume.last_seq.map(|seq| Since { seq, epoch: resume.epoch.clone() });
    OutFrame::Subscribe { req: Some(SUBSCRIBE_REQ), channel, since, client_id: None, info: None }.encode()
}

/// The fields of a server frame the bench looks at.
#[derive(Deserialize)]
struct Frame<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    #[serde(default)]
    req: Option<u64>,
    #[serde(default)]
    seq: Option<u64>,
    #[serde(default, borrow)]
    data: Option<&'a RawValue>,
    #[serde(default)]
    epoch: Option<String>,
    #[serde(default)]
    head: Option<u64>,
    #[serde(default)]
    truncated: Option<bool>,
    /// Present on the subscribe reply of acked channels.
    #[serde(default)]
    cursor: Option<u64>,
    /// Acked channels: messages this subscribe will deliver.
    #[serde(default)]
    unread: Option<u64>,
    #[serde(default)]
    redelivered: Option<bool>,
    #[serde(default)]
    epoch_changed: Option<bool>,
    #[serde(default)]
    code: Option<serde_json::Value>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    reason: Option<String>,
}

pub async fn subscribe(
    ws: &mut Ws,
    channel: &str,
    resume: &ResumePoint,
    pending: &mut VecDeque<Incoming>,
    deadline: Instant,
) -> anyhow::Result<Subscribed> {
    let frame = subscribe_frame(channel, resume);
    let sent_us = payload::now_micros();
    ws.send(Message::text(frame)).await.context("cannot send subscribe")?;
    loop {
        let msg = next_data(ws, deadline, "the subscribe reply").await?;
        let bytes: &[u8] = msg.as_payload();
        let f: Frame<'_> =
            serde_json::from_slice(bytes).with_context(|| format!("not a Herald frame: {}", clip(bytes)))?;
        match (f.kind, f.req) {
            ("ok", Some(SUBSCRIBE_REQ)) => return Ok(subscribed(f, sent_us)),
            ("error", _) => bail!(
                "subscribe refused: {} {}",
                f.code.map(|c| c.to_string()).unwrap_or_default(),
                f.message.unwrap_or_default()
            ),
            _ => decode_frame(f, bytes, pending)?,
        }
    }
}

/// What a subscribe's `ok` (or a `subscribed` frame or event, the same
/// fields) says of the subscription.
fn subscribed(f: Frame<'_>, sent_us: u64) -> Subscribed {
    let gap_reported = if f.truncated == Some(true) {
        Some("resume reply says truncated: messages were lost to retention".to_owned())
    } else if f.epoch_changed == Some(true) {
        Some("resume reply says epoch_changed: the log was reset".to_owned())
    } else {
        None
    };
    Subscribed {
        head: f.head,
        epoch: f.epoch,
        gap_reported,
        acked: f.cursor.is_some(),
        unread: f.unread,
        sent_us,
    }
}

/// The subscription a `subscribed` frame (an SSE stream's first event)
/// describes.
pub fn read_subscribed(bytes: &[u8], sent_us: u64) -> anyhow::Result<Subscribed> {
    let f: Frame<'_> =
        serde_json::from_slice(bytes).with_context(|| format!("not a subscribed frame: {}", clip(bytes)))?;
    Ok(subscribed(f, sent_us))
}

/// Decode one data frame. Herald never needs a protocol-level reply.
pub fn decode(msg: &Message, pending: &mut VecDeque<Incoming>) -> anyhow::Result<Option<Message>> {
    let bytes: &[u8] = msg.as_payload();
    if !msg.is_text() {
        bail!("binary frame from Herald: {}", clip(bytes));
    }
    decode_bytes(bytes, pending)?;
    Ok(None)
}

/// Decode one Herald frame (a `/ws` text frame, an SSE event's data).
pub fn decode_bytes(bytes: &[u8], pending: &mut VecDeque<Incoming>) -> anyhow::Result<()> {
    if let Some((stamp, seq)) = read_delivery(bytes) {
        pending.push_back(Incoming::Delivery { stamp, seq, redelivered: false });
        return Ok(());
    }
    let f: Frame<'_> =
        serde_json::from_slice(bytes).with_context(|| format!("not a Herald frame: {}", clip(bytes)))?;
    decode_frame(f, bytes, pending)
}

/// A first delivery of a bench payload, read directly in the one shape
/// herald-proto's encoder writes it:
/// `{"type":"message","channel":"C","seq":N,"id":"I","ts":T,"data":P}`
/// (`seq` on durable channels only) with `P` exactly as the bench's
/// publisher writes it (`payload::decode_encoded`). The subscribers decode
/// one frame per delivery, and serde_json's pass over the whole envelope
/// is half of a worker's CPU in fan-out, where the NATS parser reads a
/// line: with the client the bound, the figure would measure the bench. Any
/// other frame (`meta`, a redelivery, an escape, another payload or kind):
/// `None`, and serde_json reads it.
fn read_delivery(frame: &[u8]) -> Option<(payload::Stamp, Option<u64>)> {
    /// A string's contents up to its closing quote (none with escapes),
    /// and what follows the quote.
    fn string(s: &[u8]) -> Option<(&[u8], &[u8])> {
        let end = s.iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
        (s[end] == b'"').then(|| (&s[..end], &s[end + 1..]))
    }
    let (_channel, rest) = string(frame.strip_prefix(br#"{"type":"message","channel":""#)?)?;
    let (seq, rest) = match rest.strip_prefix(br#","seq":"#) {
        Some(r) => {
            let (seq, r) = payload::number(r)?;
            (Some(seq), r)
        }
        None => (None, rest),
    };
    let (_id, rest) = string(rest.strip_prefix(br#","id":""#)?)?;
    let (_ts, rest) = payload::number(rest.strip_prefix(br#","ts":"#)?)?;
    let data = rest.strip_prefix(br#","data":"#)?.strip_suffix(b"}")?;
    Some((payload::decode_encoded(data)?, seq))
}

fn decode_frame(f: Frame<'_>, bytes: &[u8], pending: &mut VecDeque<Incoming>) -> anyhow::Result<()> {
    match f.kind {
        "message" => {
            let data = f.data.ok_or_else(|| anyhow!("message without data: {}", clip(bytes)))?;
            let stamp = payload::decode(data.get().as_bytes())
                .with_context(|| format!("message is not a bench payload: {}", clip(bytes)))?;
            let redelivered = f.redelivered.unwrap_or(false);
            pending.push_back(Incoming::Delivery { stamp, seq: f.seq, redelivered });
        }
        "disconnect" => {
            let code = f.code.map(|c| c.to_string()).unwrap_or_default();
            pending
                .push_back(Incoming::Closing(format!("disconnect {code}: {}", f.reason.unwrap_or_default())));
        }
        "pong" | "ok" => {}
        "error" => bail!(
            "error frame: {} {}",
            f.code.map(|c| c.to_string()).unwrap_or_default(),
            f.message.unwrap_or_default()
        ),
        other => bail!("unexpected frame type `{other}`: {}", clip(bytes)),
    }
    Ok(())
}

/// Acks at most this many deliveries at once…
const ACK_EVERY: u32 = 64;
/// …or this long after the first unacked one, whichever comes first. Both
/// keep a connection far below the server's client frame budget.
const ACK_DELAY: std::time::Duration = std::time::Duration::from_millis(20);

/// Cumulative acks of one acked subscription, batched like a real client
/// would: one `ack` up to the highest seq handed to the caller.
pub struct Acker {
    channel: String,
    highest: Option<u64>,
    unacked: u32,
    due: Option<Instant>,
}

impl Acker {
    pub fn new(channel: &str) -> Self {
        Acker { channel: channel.to_owned(), highest: None, unacked: 0, due: None }
    }

    /// A delivery with this seq was handed to the caller.
    pub fn delivered(&mut self, seq: u64) {
        self.highest = Some(self.highest.map_or(seq, |h| h.max(seq)));
        self.unacked += 1;
        self.due.get_or_insert_with(|| Instant::now() + ACK_DELAY);
    }

    /// When the pending ack must go out at the latest.
    pub fn due(&self) -> Option<Instant> {
        self.due
    }

    /// The ack frame (and the seq it acks) if a full batch is waiting.
    pub fn take_if_full(&mut self) -> Option<(u64, Message)> {
        if self.unacked >= ACK_EVERY {
            self.take()
        } else {
            None
        }
    }

    /// The ack frame for everything handed out so far (and the seq it
    /// acks), if anything.
    pub fn take(&mut self) -> Option<(u64, Message)> {
        self.due = None;
        self.unacked = 0;
        let seq = self.highest.take()?;
        let frame = OutFrame::Ack { req: None, channel: &self.channel, seq }.encode();
        Some((seq, Message::text(frame)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_messages_and_disconnects() {
        let mut out = VecDeque::new();
        let msg = Message::text(
            r#"{"type":"message","channel":"chat:1","seq":9,"id":"x","ts":1,"data":{"n":3,"t":5,"p":"xx"}}"#,
        );
        decode(&msg, &mut out).unwrap();
        match out.pop_front() {
            Some(Incoming::Delivery { stamp, seq, redelivered }) => {
                assert_eq!((stamp.n, stamp.t, seq, redelivered), (3, 5, Some(9), false))
            }
            other => panic!("{other:?}"),
        }
        decode(&Message::text(r#"{"type":"disconnect","code":4008,"reason":"slow consumer"}"#), &mut out)
            .unwrap();
        assert!(matches!(out.pop_front(), Some(Incoming::Closing(r)) if r.contains("4008")));
        assert!(decode(&Message::text(r#"{"type":"message","seq":1,"data":"not ours"}"#), &mut out).is_err());
    }

    #[test]
    fn deliveries_read_directly_agree_with_serde_json_and_the_rest_is_left_to_it() {
        use herald_proto::{encode_message_frame, mark_redelivered, ChannelName};
        let via_serde = |frame: &[u8]| {
            let f: Frame<'_> = serde_json::from_slice(frame).unwrap();
            (payload::decode(f.data.unwrap().get().as_bytes()).unwrap(), f.seq)
        };
        let channel = ChannelName::new("chat:bench-7").unwrap();
        let data = |p: Vec<u8>| RawValue::from_string(String::from_utf8(p).unwrap()).unwrap();
        let meta: herald_proto::Meta = [("k".to_owned(), "v".to_owned())].into_iter().collect();
        for seq in [None, Some(0), Some(1), Some(u64::MAX)] {
            let p = data(payload::encode(42, 100));
            let frame = encode_message_frame(&channel, seq, "019a-id", 1_700_000_000_000, &p, None);
            assert_eq!(read_delivery(&frame), Some(via_serde(&frame)), "{}", clip(&frame));
            // Shapes the direct reading leaves to serde_json.
            let with_meta = encode_message_frame(&channel, seq, "019a-id", 1, &p, Some(&meta));
            let redelivered = mark_redelivered(&frame, 2);
            let other =
                encode_message_frame(&channel, seq, "id", 1, &data(br#"{"n":1,"t":2}"#.to_vec()), None);
            for f in [&with_meta, &redelivered, &other] {
                assert_eq!(read_delivery(f), None, "{}", clip(f));
                let mut out = VecDeque::new();
                decode(&Message::text(String::from_utf8(f.clone()).unwrap()), &mut out).unwrap();
                match out.pop_front() {
                    Some(Incoming::Delivery { stamp, seq: s, .. }) => assert_eq!((stamp, s), via_serde(f)),
                    other => panic!("{other:?}"),
                }
            }
        }
        for bad in [
            &br#"{"type":"message","channel":"c\"x","seq":1,"id":"i","ts":1,"data":{"n":1,"t":2,"p":"x"}}"#[..],
            br#"{"type":"message","channel":"c","seq":01,"id":"i","ts":1,"data":{"n":1,"t":2,"p":"x"}}"#,
            br#"{"type":"message","channel":"c","seq":1.5,"id":"i","ts":1,"data":{"n":1,"t":2,"p":"x"}}"#,
            br#"{"type":"message","channel":"c","seq":1,"id":"i","ts":1,"data":{"n":1,"t":2,"p":"x"}"#,
            br#"{"type":"room","channel":"c","seq":1,"id":"i","ts":1,"data":{"n":1,"t":2,"p":"x"}}"#,
            br#"{"type":"message","channel":"c","seq":1,"id":"i","ts":1,"data":{"n":1,"t":2,"p":"x"},"x":1}"#,
        ] {
            assert_eq!(read_delivery(bad), None, "{}", clip(bad));
        }
    }

    #[test]
    fn acks_are_cumulative_and_batched() {
        let mut a = Acker::new("user:1");
        assert!(a.take().is_none() && a.due().is_none());
        a.delivered(5);
        a.delivered(4);
        assert!(a.due().is_some());
        assert!(a.take_if_full().is_none());
        let (seq, frame) = a.take().unwrap();
        assert_eq!(seq, 5);
        assert_eq!(frame.as_text(), Some(r#"{"type":"ack","channel":"user:1","seq":5}"#));
        assert!(a.due().is_none());
        for seq in 10..10 + u64::from(ACK_EVERY) {
            a.delivered(seq);
        }
        let (seq, frame) = a.take_if_full().unwrap();
        assert_eq!(seq, 9 + u64::from(ACK_EVERY));
        assert!(frame.as_text().unwrap().contains(&format!("\"seq\":{seq}")));
    }

    #[test]
    fn subscribe_frame_carries_since_only_when_resuming() {
        let fresh = ResumePoint::default();
        assert_eq!(subscribe_frame("c", &fresh), r#"{"type":"subscribe","req":1,"channel":"c"}"#);
        let resume = ResumePoint { last_seq: Some(4), epoch: Some("E".into()) };
        assert!(subscribe_frame("c", &resume).ends_with(r#""since":{"seq":4,"epoch":"E"}}"#));
    }
}
