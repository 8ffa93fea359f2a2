//! Herald's Centrifugo endpoint on its Protobuf wire (docs/centrifugo.md):
//! `connect`, `subscribe` with `recover` on reconnect, then `pub` pushes,
//! each binary frame holding varint-length-prefixed replies; the server's
//! ping is an empty reply, answered with an empty command. The wire the
//! Swift, Java and Dart SDKs speak, measured beside `/ws` (`--wire`).

use std::collections::VecDeque;

use anyhow::{anyhow, bail, Context};
use futures_util::SinkExt;
use herald_proto::centrifugo_pb::{self as cf, pb};
use tokio::time::Instant;
use tokio_websockets::Message;

use super::{clip, next_data, Incoming, ResumePoint, Subscribed, Ws, WsAuth};
use crate::payload;

const CONNECT_ID: u32 = 1;
const SUBSCRIBE_ID: u32 = 2;
/// Largest frame a reply may be read from (the server's outbox bound).
const MAX_FRAME: usize = 16 * 1024 * 1024;

pub fn path(auth: &WsAuth, user: &str) -> String {
    match auth {
        WsAuth::Dev => format!("/connection/websocket?format=protobuf&user={user}"),
        WsAuth::Token(_) => format!("/connection/websocket?format=protobuf&device={user}"),
    }
}

fn frame(command: pb::Command) -> Message {
    let mut out = Vec::new();
    cf::append(&mut out, &command);
    Message::binary(out)
}

/// The replies of a data frame.
fn replies(msg: &Message) -> anyhow::Result<Vec<pb::Reply>> {
    let bytes = msg.as_payload();
    if !msg.is_binary() {
        bail!("text frame on the Protobuf wire: {}", clip(bytes));
    }
    cf::decode_replies(bytes, MAX_FRAME)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("undecodable reply frame: {e}"))
}

/// Connect, then subscribe (recovering from `resume`), returning once the
/// subscribe reply arrived; recovered publications go to `pending`.
pub async fn subscribe(
    ws: &mut Ws,
    auth: &WsAuth,
    channel: &str,
    resume: &ResumePoint,
    pending: &mut VecDeque<Incoming>,
    deadline: Instant,
) -> anyhow::Result<Subscribed> {
    let token = match auth {
        WsAuth::Token(t) => t.clone(),
        WsAuth::Dev => String::new(),
    };
    let connect = pb::ConnectRequest { token, ..Default::default() };
    ws.send(frame(pb::Command { id: CONNECT_ID, connect: Some(connect), ..Default::default() }))
        .await
        .context("cannot send connect")?;
    let sent_us = payload::now_micros();
    let subscribe = pb::SubscribeRequest {
        channel: channel.to_owned(),
        recover: resume.last_seq.is_some(),
        offset: resume.last_seq.unwrap_or(0),
        epoch: resume.epoch.clone().unwrap_or_default(),
        ..Default::default()
    };
    ws.send(frame(pb::Command { id: SUBSCRIBE_ID, subscribe: Some(subscribe), ..Default::default() }))
        .await
        .context("cannot send subscribe")?;
    loop {
        let msg = next_data(ws, deadline, "the subscribe reply").await?;
        for r in replies(&msg)? {
            if let Some(e) = r.error {
                bail!("command {} refused: {} {}", r.id, e.code, e.message);
            }
            if r.id != SUBSCRIBE_ID {
                push(r, pending)?;
                continue;
            }
            let s = r.subscribe.ok_or_else(|| anyhow!("the subscribe reply has no result"))?;
            let publications = s.publications.iter().map(|p| (&p.data[..], p.offset));
            return subscribed(resume, s.recovered, s.offset, s.epoch, publications, pending, sent_us);
        }
    }
}

/// A subscribe reply of either Centrifugo wire, read: its recovered
/// publications go to `pending`; live delivery follows the last of them,
/// or the head the reply names.
pub(super) fn subscribed<'a>(
    resume: &ResumePoint,
    recovered: bool,
    offset: u64,
    epoch: String,
    publications: impl Iterator<Item = (&'a [u8], u64)>,
    pending: &mut VecDeque<Incoming>,
    sent_us: u64,
) -> anyhow::Result<Subscribed> {
    let gap_reported = (resume.last_seq.is_some() && !recovered)
        .then(|| "the resume was not recovered: messages were lost".to_owned());
    let mut last = None;
    for (data, offset) in publications {
        delivery(data, offset, pending)?;
        last = Some(offset);
    }
    Ok(Subscribed {
        head: Some(last.unwrap_or(offset)),
        epoch: Some(epoch).filter(|e| !e.is_empty()),
        gap_reported,
        acked: false,
        unread: None,
        sent_us,
    })
}

/// One publication of either Centrifugo wire: its `data` and `offset`.
pub(super) fn delivery(data: &[u8], offset: u64, pending: &mut VecDeque<Incoming>) -> anyhow::Result<()> {
    let stamp = payload::decode(data).with_context(|| format!("not a bench payload: {}", clip(data)))?;
    pending.push_back(Incoming::Delivery { stamp, seq: (offset > 0).then_some(offset), redelivered: false });
    Ok(())
}

/// A push (or the server's ping, an empty reply).
fn push(r: pb::Reply, pending: &mut VecDeque<Incoming>) -> anyhow::Result<bool> {
    let Some(push) = r.push else { return Ok(r.id == 0) };
    if let Some(p) = &push.r#pub {
        delivery(&p.data, p.offset, pending)?;
    } else if let Some(d) = push.disconnect {
        pending.push_back(Incoming::Closing(format!("disconnect {}: {}", d.code, d.reason)));
    }
    Ok(false)
}

/// Decode one data frame; a ping gets its pong (an empty command). A
/// frame of `pub` pushes (what fan-out sends) is read in place, without
/// building the messages (the subscribers decode one per delivery: with
/// prost's allocations the figure would measure the bench); anything else
/// goes through prost.
pub fn decode(msg: &Message, pending: &mut VecDeque<Incoming>) -> anyhow::Result<Option<Message>> {
    if msg.is_binary() {
        if let Some(fast) = pub_pushes(msg.as_payload()) {
            for (data, offset) in fast {
                delivery(data, offset, pending)?;
            }
            return Ok(None);
        }
    }
    let mut ping = false;
    for r in replies(msg)? {
        ping |= push(r, pending)?;
    }
    Ok(ping.then(|| frame(pb::Command::default())))
}

/// A varint at the start of `b`, and the rest.
fn varint(b: &[u8]) -> Option<(u64, &[u8])> {
    let mut v = 0u64;
    for (i, byte) in b.iter().enumerate().take(10) {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, &b[i + 1..]));
        }
    }
    None
}

/// Call `f` with each field of a message, `(field, value)` with the value
/// a varint or a length-delimited slice; `None` at anything else (another
/// wire type, a truncation) or when `f` says so.
fn each_field<'a>(mut b: &'a [u8], mut f: impl FnMut(u64, Field<'a>) -> Option<()>) -> Option<()> {
    while !b.is_empty() {
        let (key, rest) = varint(b)?;
        let (value, rest) = match key & 7 {
            0 => {
                let (v, rest) = varint(rest)?;
                (Field::Varint(v), rest)
            }
            2 => {
                let (len, rest) = varint(rest)?;
                let len = usize::try_from(len).ok().filter(|&l| l <= rest.len())?;
                (Field::Bytes(&rest[..len]), &rest[len..])
            }
            _ => return None,
        };
        f(key >> 3, value)?;
        b = rest;
    }
    Some(())
}

#[derive(Clone, Copy)]
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

/// `(data, offset)` of each message of a frame made only of `pub` pushes
/// (`Reply.push` = field 4, `Push.pub` = 4, `Publication.data` = 4 and
/// `.offset` = 6), read in place; `None` when any message is something
/// else.
fn pub_pushes(mut frame: &[u8]) -> Option<Vec<(&[u8], u64)>> {
    let mut out = Vec::new();
    while !frame.is_empty() {
        let (len, rest) = varint(frame)?;
        let len = usize::try_from(len).ok().filter(|&l| l <= rest.len())?;
        let (reply, rest) = rest.split_at(len);
        frame = rest;
        let mut push = None;
        each_field(reply, |field, value| match (field, value) {
            (4, Field::Bytes(p)) => {
                push = Some(p);
                Some(())
            }
            _ => None,
        })?;
        let mut publication = None;
        each_field(push?, |field, value| match (field, value) {
            (4, Field::Bytes(p)) => {
                publication = Some(p);
                Some(())
            }
            (1 | 2, _) => Some(()),
            _ => None,
        })?;
        let (mut data, mut offset) = (None, 0);
        each_field(publication?, |field, value| {
            match (field, value) {
                (4, Field::Bytes(d)) => data = Some(d),
                (6, Field::Varint(o)) => offset = o,
                _ => {}
            }
            Some(())
        })?;
        out.push((data?, offset));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_of_a_push_and_a_ping_gives_the_delivery_and_a_pong() {
        let mut bytes = Vec::new();
        let publication = pb::Publication { data: payload::encode(5, 64), offset: 7, ..Default::default() };
        let push = pb::Push { channel: "chat:x".into(), r#pub: Some(publication), ..Default::default() };
        cf::append(&mut bytes, &pb::Reply { push: Some(push), ..Default::default() });
        cf::append(&mut bytes, &pb::Reply::default());
        let mut pending = VecDeque::new();
        let pong = decode(&Message::binary(bytes), &mut pending).unwrap().expect("a pong");
        assert_eq!(pong.as_payload().as_ref(), [0u8], "an empty command, length-prefixed");
        let Some(Incoming::Delivery { stamp, seq, .. }) = pending.pop_front() else { panic!("{pending:?}") };
        assert_eq!((stamp.n, seq), (5, Some(7)));
        assert!(decode(&Message::text("{}"), &mut pending).is_err(), "text is not this wire");
    }

    #[test]
    fn pub_pushes_read_in_place_match_prost() {
        let mut bytes = Vec::new();
        for (n, offset) in [(1, 11), (2, 0)] {
            let mut tags = std::collections::BTreeMap::new();
            tags.insert("herald_id".to_owned(), "x".to_owned());
            let publication =
                pb::Publication { data: payload::encode(n, 64), offset, tags, time: 5, ..Default::default() };
            let push = pb::Push { channel: "chat:x".into(), r#pub: Some(publication), ..Default::default() };
            cf::append(&mut bytes, &pb::Reply { push: Some(push), ..Default::default() });
        }
        let fast = pub_pushes(&bytes).expect("pub pushes only");
        let slow: Vec<_> =
            cf::decode_replies(&bytes, MAX_FRAME).map(|r| r.unwrap().push.unwrap().r#pub.unwrap()).collect();
        assert_eq!(fast.len(), 2);
        for ((data, offset), p) in fast.iter().zip(&slow) {
            assert_eq!((*data, *offset), (&p.data[..], p.offset));
        }
        // A ping (an empty reply) is not a pub push: prost reads that frame.
        cf::append(&mut bytes, &pb::Reply::default());
        assert!(pub_pushes(&bytes).is_none());
    }
}
