//! Between the Protobuf messages ([`pb`]) and the JSON wire's types
//! ([`crate::centrifugo`]): commands come in as `pb::Command` and leave as
//! the session's `Command`; replies and pushes leave as the session made
//! them for either wire. Fields Herald does not use (a connect's `data`,
//! a subscribe's `token`) are dropped here, as the JSON wire ignores them.

use std::collections::BTreeMap;

use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use super::{append, pb};
use crate::centrifugo::{
    self as cf, Answer, ChannelRequest, ClientInfo, Command, ConnectRequest, HistoryRequest, Publication,
    PublishRequest, Push, RefreshRequest, Reply, StreamPosition, SubscribeRequest,
};
use crate::ErrorCode;

/// A command that decoded but cannot be applied: answered with an error
/// reply to its `id` ([`CommandError::code`]); the connection stays.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// `data` is JSON on every wire of Herald; here it must be its UTF-8 text.
    #[error("publish `data` is not UTF-8 JSON text")]
    DataNotUtf8 { id: u32 },
    #[error("publish `data` is not JSON: {source}")]
    DataNotJson { id: u32, source: serde_json::Error },
}

impl CommandError {
    /// The command's `id`, for the error reply.
    pub fn id(&self) -> u32 {
        match self {
            CommandError::DataNotUtf8 { id } | CommandError::DataNotJson { id, .. } => *id,
        }
    }

    pub fn code(&self) -> ErrorCode {
        ErrorCode::BadData
    }
}

/// A publish's `data` as the JSON wire has it. Only JSON validity is checked
/// here; the publish rules ([`crate::check_data`]) apply at publish, as for
/// the JSON wire. Empty `data` (what an absent field decodes to) is not JSON.
fn json_data(id: u32, data: Vec<u8>) -> Result<Box<RawValue>, CommandError> {
    let text = String::from_utf8(data).map_err(|_| CommandError::DataNotUtf8 { id })?;
    serde_json::from_str(&text).map_err(|source| CommandError::DataNotJson { id, source })
}

fn subscribe_request(r: pb::SubscribeRequest) -> SubscribeRequest {
    SubscribeRequest { channel: r.channel, recover: r.recover, offset: r.offset, epoch: r.epoch }
}

fn subscribe_result(s: &cf::SubscribeResult<'_>) -> pb::SubscribeResult {
    pb::SubscribeResult {
        recoverable: s.recoverable,
        positioned: s.positioned,
        epoch: s.epoch.clone(),
        offset: s.offset,
        publications: publications(&s.publications),
        recovered: s.recovered,
        was_recovering: s.was_recovering,
        ..Default::default()
    }
}

impl TryFrom<pb::Command> for Command {
    type Error = CommandError;

    fn try_from(c: pb::Command) -> Result<Self, CommandError> {
        let id = c.id;
        let channel = |channel| ChannelRequest { channel };
        Ok(Command {
            id,
            connect: c.connect.map(|r| ConnectRequest {
                token: r.token,
                name: r.name,
                version: r.version,
                subs: r.subs.into_iter().map(|(channel, s)| (channel, subscribe_request(s))).collect(),
            }),
            subscribe: c.subscribe.map(subscribe_request),
            unsubscribe: c.unsubscribe.map(|r| channel(r.channel)),
            publish: c
                .publish
                .map(|r| {
                    Ok::<_, CommandError>(PublishRequest { channel: r.channel, data: json_data(id, r.data)? })
                })
                .transpose()?,
            presence: c.presence.map(|r| channel(r.channel)),
            presence_stats: c.presence_stats.map(|r| channel(r.channel)),
            history: c.history.map(|r| HistoryRequest {
                channel: r.channel,
                limit: r.limit,
                since: r.since.map(|s| StreamPosition { offset: s.offset, epoch: s.epoch }),
                reverse: r.reverse,
            }),
            ping: c.ping.map(|_| IgnoredAny),
            send: c.send.map(|_| IgnoredAny),
            rpc: c.rpc.map(|_| IgnoredAny),
            refresh: c.refresh.map(|r| RefreshRequest { token: r.token }),
            sub_refresh: c.sub_refresh.map(|_| IgnoredAny),
        })
    }
}

/// Milliseconds as the protocol's `int64`.
fn millis(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

fn json_bytes(v: Option<&serde_json::Value>) -> Vec<u8> {
    // A `Value` always serialises (its map keys are strings).
    v.map(|v| serde_json::to_vec(v).unwrap_or_default()).unwrap_or_default()
}

impl From<&ClientInfo> for pb::ClientInfo {
    fn from(i: &ClientInfo) -> Self {
        pb::ClientInfo {
            user: i.user.clone(),
            client: i.client.clone(),
            conn_info: json_bytes(i.conn_info.as_ref()),
            chan_info: json_bytes(i.chan_info.as_ref()),
        }
    }
}

impl From<&Publication<'_>> for pb::Publication {
    fn from(p: &Publication<'_>) -> Self {
        pb::Publication {
            data: p.data.get().as_bytes().to_vec(),
            info: p.info.as_ref().map(Into::into),
            offset: p.offset,
            tags: p.tags.clone(),
            time: millis(p.time),
            ..Default::default()
        }
    }
}

fn publications(ps: &[Publication<'_>]) -> Vec<pb::Publication> {
    ps.iter().map(Into::into).collect()
}

fn refresh(r: &cf::RefreshResult) -> pb::RefreshResult {
    pb::RefreshResult { client: r.client.clone(), version: r.version.clone(), expires: r.expires, ttl: r.ttl }
}

impl From<&Reply<'_>> for pb::Reply {
    fn from(r: &Reply<'_>) -> Self {
        let mut out = pb::Reply { id: r.id, ..Default::default() };
        match &r.result {
            Answer::Error(e) => {
                out.error =
                    Some(pb::Error { code: e.code, message: e.message.clone(), temporary: e.temporary })
            }
            Answer::Connect(c) => {
                let s = refresh(&c.session);
                out.connect = Some(pb::ConnectResult {
                    client: s.client,
                    version: s.version,
                    expires: s.expires,
                    ttl: s.ttl,
                    ping: c.ping,
                    pong: c.pong,
                    subs: c.subs.iter().map(|(channel, s)| (channel.clone(), subscribe_result(s))).collect(),
                    ..Default::default()
                });
            }
            Answer::Subscribe(s) => out.subscribe = Some(subscribe_result(s)),
            Answer::Unsubscribe(_) => out.unsubscribe = Some(pb::UnsubscribeResult {}),
            Answer::Publish(_) => out.publish = Some(pb::PublishResult {}),
            Answer::Presence(p) => {
                let presence = p.presence.iter().map(|(k, v)| (k.clone(), v.into())).collect();
                out.presence = Some(pb::PresenceResult { presence });
            }
            Answer::PresenceStats(s) => {
                out.presence_stats = Some(pb::PresenceStatsResult {
                    num_clients: u32::try_from(s.num_clients).unwrap_or(u32::MAX),
                    num_users: u32::try_from(s.num_users).unwrap_or(u32::MAX),
                });
            }
            Answer::History(h) => {
                out.history = Some(pb::HistoryResult {
                    publications: publications(&h.publications),
                    epoch: h.epoch.clone(),
                    offset: h.offset,
                });
            }
            Answer::Ping(_) => out.ping = Some(pb::PingResult {}),
            Answer::Refresh(r) => out.refresh = Some(refresh(r)),
        }
        out
    }
}

/// A push travels as a `Reply` with no `id`.
impl From<&Push<'_>> for pb::Reply {
    fn from(p: &Push<'_>) -> Self {
        let info = |j: &cf::JoinLeave| Some(pb::ClientInfo::from(&j.info));
        let push = pb::Push {
            channel: p.channel.to_owned(),
            r#pub: p.publication.as_ref().map(Into::into),
            join: p.join.as_ref().map(|j| pb::Join { info: info(j) }),
            leave: p.leave.as_ref().map(|l| pb::Leave { info: info(l) }),
            unsubscribe: p
                .unsubscribe
                .as_ref()
                .map(|u| pb::Unsubscribe { code: u.code, reason: u.reason.clone() }),
            subscribe: p.subscribe.as_ref().map(|s| pb::Subscribe {
                recoverable: s.recoverable,
                epoch: s.epoch.clone(),
                offset: s.offset,
                positioned: s.positioned,
                data: Vec::new(),
            }),
            ..Default::default()
        };
        pb::Reply { push: Some(push), ..Default::default() }
    }
}

/// Append a reply to the frame being written in `out`.
pub fn append_reply(out: &mut Vec<u8>, reply: &Reply<'_>) {
    append(out, &pb::Reply::from(reply));
}

/// Append a push to the frame being written in `out`.
pub fn append_push(out: &mut Vec<u8>, push: &Push<'_>) {
    append(out, &pb::Reply::from(push));
}

/// A Herald frame (stored or broadcast) as a push, length-prefixed: the
/// Protobuf twin of [`cf::push_of_frame`], with the same `pub`, `join` and
/// `leave` pushes. `None` for a frame that does not read.
pub fn push_of_frame(channel: &str, frame: &[u8]) -> Option<Vec<u8>> {
    let stored = crate::StoredFrame::parse(frame).ok();
    let mut out = Vec::new();
    match stored.as_ref().map(|s| s.kind.as_str()) {
        Some("join" | "leave") | None => {
            let view = crate::MessageView::parse(frame).ok()?;
            let info = cf::JoinLeave { info: ClientInfo::from(view.member?) };
            let mut push = Push::new(channel);
            if view.kind == "join" {
                push.join = Some(info);
            } else {
                push.leave = Some(info);
            }
            append_push(&mut out, &push);
        }
        Some(_) => {
            let p = Publication::from_stored(stored.as_ref()?, cf::null_value());
            append_pub_push(&mut out, channel, p.data.get().as_bytes(), p.offset, &p.tags, p.time);
        }
    }
    Some(out)
}

/// Protobuf's length of a length-delimited field of `len` bytes.
fn field_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn put_field(out: &mut Vec<u8>, tag: u32, bytes: &[u8]) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

fn put_uint(out: &mut Vec<u8>, tag: u32, n: u64) {
    encode_key(tag, WireType::Varint, out);
    encode_varint(n, out);
}

fn uint_len(tag: u32, n: u64) -> usize {
    key_len(tag) + encoded_len_varint(n)
}

/// Append, length-prefixed, the push of one publication of `channel`:
/// `data` (JSON), `offset` (0: none), `tags` and `time` (milliseconds; 0:
/// none). The bytes are those of `pb::Reply { push: Some(pb::Push { channel,
/// pub: Some(pb::Publication { .. }) }) }` (a test checks it), written from
/// the borrowed parts without building the messages: a live message is
/// encoded once per node and wire, then shared by every subscriber.
pub fn append_pub_push(
    out: &mut Vec<u8>,
    channel: &str,
    data: &[u8],
    offset: u64,
    tags: &BTreeMap<String, String>,
    time: u64,
) {
    // Fields in tag order, and those with the default value left out, as
    // prost writes them (a map entry leaves out an empty key or value too).
    let entry_len = |k: &str, v: &str| {
        (if k.is_empty() { 0 } else { field_len(1, k.len()) })
            + (if v.is_empty() { 0 } else { field_len(2, v.len()) })
    };
    let time = time.min(i64::MAX as u64); // `int64` on the wire
    let mut publication = 0;
    if !data.is_empty() {
        publication += field_len(4, data.len());
    }
    if offset != 0 {
        publication += uint_len(6, offset);
    }
    publication += tags.iter().map(|(k, v)| field_len(7, entry_len(k, v))).sum::<usize>();
    if time != 0 {
        publication += uint_len(9, time);
    }
    let push = if channel.is_empty() { 0 } else { field_len(2, channel.len()) } + field_len(4, publication);
    let reply = field_len(4, push);

    out.reserve(encoded_len_varint(reply as u64) + reply);
    encode_varint(reply as u64, out);
    encode_key(4, WireType::LengthDelimited, out); // Reply.push
    encode_varint(push as u64, out);
    if !channel.is_empty() {
        put_field(out, 2, channel.as_bytes()); // Push.channel
    }
    encode_key(4, WireType::LengthDelimited, out); // Push.pub
    encode_varint(publication as u64, out);
    if !data.is_empty() {
        put_field(out, 4, data);
    }
    if offset != 0 {
        put_uint(out, 6, offset);
    }
    for (k, v) in tags {
        encode_key(7, WireType::LengthDelimited, out);
        encode_varint(entry_len(k, v) as u64, out);
        if !k.is_empty() {
            put_field(out, 1, k.as_bytes());
        }
        if !v.is_empty() {
            put_field(out, 2, v.as_bytes());
        }
    }
    if time != 0 {
        put_uint(out, 9, time);
    }
}
