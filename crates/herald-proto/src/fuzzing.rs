//! Fuzz harnesses: what the server does with untrusted input, and the
//! properties it must keep (no panic, `data` byte for byte from the request
//! to every way it is served). The `fuzz/` targets call these, and the tests
//! below replay every seed and every kept regression input of `fuzz/`
//! through them, so a crash once found stays fixed without the fuzzer.

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::{
    check_data, encode_message_frame, mark_redelivered, BatchBody, ChannelName, ChannelNameError,
    ClientFrame, DataError, HistoryPage, Meta, PublishBody, StoredFrame, MAX_CHANNEL_LEN,
    MAX_DATA_DEPTH_LIMIT, MAX_LIMITED_USERS,
};

/// `fuzz/` target `client_frame`: one WebSocket text frame from a client,
/// on `/ws` and on the Centrifugo endpoint.
pub fn client_frame(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else { return }; // WebSocket text is UTF-8
    centrifugo_frame(text);
    let Ok(frame) = ClientFrame::parse(text) else { return };
    if let ClientFrame::Publish { channel, data, meta, .. } = frame {
        data_invariants(&data);
        served_as_published(&channel, &data, meta.as_ref());
    }
}

/// The same frame as Centrifugo commands, one per line: a publish's `data`
/// keeps the publish rules' invariants, and served as a push it stays one
/// line that reads back as the same value (only whitespace newlines change).
fn centrifugo_frame(text: &str) {
    use crate::centrifugo::{push_of_frame, Command};
    for line in text.split('\n') {
        let Ok(cmd) = Command::parse(line.trim()) else { continue };
        let Some((p, channel, frame)) = published(cmd) else { continue };
        let push = push_of_frame(channel.as_str(), &frame).expect("a frame we made becomes a push");
        assert!(!push.contains(&b'\n'));
        // serde_json's own depth limit may refuse what the rules allow.
        if let Ok(want) = serde_json::from_str::<serde_json::Value>(p.data.get()) {
            let got: serde_json::Value = serde_json::from_slice(&push).expect("a push is JSON");
            assert_eq!(got["push"]["pub"]["data"], want);
        }
    }
}

/// A Centrifugo publish, whichever wire it came on: its `data` keeps the
/// publish rules' invariants and is served as published; with a valid
/// channel, the message frame it would be stored as.
fn published(
    cmd: crate::centrifugo::Command,
) -> Option<(crate::centrifugo::PublishRequest, ChannelName, Vec<u8>)> {
    let crate::centrifugo::Method::Publish(p) = cmd.method() else { return None };
    data_invariants(&p.data);
    let channel = ChannelName::new(&p.channel).ok()?;
    served_as_published(&channel, &p.data, None);
    let frame = encode_message_frame(&channel, Some(1), "id", 1, &p.data, None);
    Some((p, channel, frame))
}

/// `fuzz/` target `centrifugo_protobuf`: one binary WebSocket frame from a
/// client on the Centrifugo endpoint, in the Protobuf encoding. Every
/// command decoded encodes back to itself; an error points inside the
/// frame and ends it; a publish's `data` keeps the publish rules'
/// invariants and comes back byte for byte in its `pub` push.
pub fn centrifugo_protobuf(bytes: &[u8]) {
    use crate::centrifugo::Command;
    use crate::centrifugo_pb::{append, decode_commands, push_of_frame, FrameError};
    const MAX: usize = 64 * 1024;
    for item in decode_commands(bytes, MAX) {
        let cmd = match item {
            Ok(cmd) => cmd,
            Err(
                FrameError::TooLarge { at, .. }
                | FrameError::Truncated { at }
                | FrameError::BadLength { at }
                | FrameError::Invalid { at, .. },
            ) => {
                assert!(at < bytes.len());
                break;
            }
        };
        let mut again = Vec::new();
        append(&mut again, &cmd);
        let back: Vec<_> = decode_commands(&again, usize::MAX).collect();
        assert!(matches!(&back[..], [Ok(c)] if *c == cmd), "{cmd:?} encodes back to {back:?}");

        let Ok(cmd) = Command::try_from(cmd) else { continue };
        let Some((p, channel, frame)) = published(cmd) else { continue };
        let push = push_of_frame(channel.as_str(), &frame).expect("a frame we made becomes a push");
        let replies: Vec<_> = crate::centrifugo_pb::decode_replies(&push, usize::MAX).collect();
        let [Ok(reply)] = &replies[..] else { panic!("one push: {replies:?}") };
        let publication = reply.push.as_ref().and_then(|p| p.r#pub.as_ref()).expect("a pub push");
        assert_eq!(publication.data, p.data.get().as_bytes());
    }
}

/// `fuzz/` target `publish_body`: an HTTP publish body, single, batch or
/// many messages.
pub fn publish_body(bytes: &[u8]) {
    let channel = ChannelName::new("chat:fuzz").expect("valid name");
    if let Ok(body) = PublishBody::parse(bytes) {
        data_invariants(&body.data);
        served_as_published(&channel, &body.data, body.meta.as_ref());
    }
    if let Ok(body) = BatchBody::parse(bytes) {
        data_invariants(&body.data);
        for name in &body.channels {
            if let Ok(ch) = ChannelName::new(name) {
                served_as_published(&ch, &body.data, body.meta.as_ref());
            }
        }
    }
    // `POST /api/v1/messages`: the server checks each message's channel and
    // `meta` on its own; those it would accept are served as published.
    if let Ok(body) = <crate::MessagesBody as crate::RequestBody>::parse(bytes) {
        for m in &body.messages {
            data_invariants(&m.data);
            let meta_ok = m.meta.as_ref().is_none_or(|meta| crate::validate_meta(meta).is_ok());
            if let (Ok(ch), true) = (ChannelName::new(&m.channel), meta_ok) {
                served_as_published(&ch, &m.data, m.meta.as_ref());
            }
        }
    }
}

/// `fuzz/` target `channel_name`: a channel name from a path, a frame or a
/// token pattern.
pub fn channel_name(bytes: &[u8]) {
    // As a JSON string (frames, batch bodies): the same rule as a path.
    if let Ok(ch) = serde_json::from_slice::<ChannelName>(bytes) {
        let s: String = serde_json::from_slice(bytes).expect("a channel name is a string");
        assert_eq!(ch.as_str(), s);
    }
    let Ok(s) = std::str::from_utf8(bytes) else { return };
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"_-.:@=".contains(&b);
    // The name before `#`, and the user ids after it.
    let (base, users) = match s.split_once('#') {
        Some((base, users)) => (base, Some(users)),
        None => (s, None),
    };
    let user_ok = |id: &str| !id.is_empty() && id.bytes().all(|b| allowed(b) && b != b':');
    match ChannelName::new(s) {
        Ok(ch) => {
            assert_eq!(ch.as_str(), s);
            assert!(!base.is_empty() && s.len() <= MAX_CHANNEL_LEN);
            assert!(base.bytes().all(allowed), "{s:?}");
            match users {
                Some(users) => {
                    let ids: Vec<&str> = users.split(',').collect();
                    assert!(ids.len() <= MAX_LIMITED_USERS && ids.iter().all(|id| user_ok(id)), "{s:?}");
                    assert_eq!(ch.limited_users().expect("user-limited").collect::<Vec<_>>(), ids);
                }
                None => assert!(ch.limited_users().is_none()),
            }
            match s.split_once(':') {
                Some((ns, local)) => assert_eq!((ch.namespace(), ch.local_part()), (ns, local)),
                None => assert_eq!((ch.namespace(), ch.local_part()), ("", s)),
            }
            assert_eq!(s.parse::<ChannelName>().as_ref(), Ok(&ch));
        }
        Err(ChannelNameError::Empty) => assert!(base.is_empty()),
        Err(ChannelNameError::TooLong) => assert!(s.len() > MAX_CHANNEL_LEN),
        Err(ChannelNameError::BadChar(at)) => {
            assert!(s.len() <= MAX_CHANNEL_LEN && at < base.len());
            assert!(!allowed(s.as_bytes()[at]) && s.as_bytes()[..at].iter().copied().all(allowed));
        }
        Err(ChannelNameError::BadUserList) => {
            let users = users.expect("a user list");
            assert!(!base.is_empty() && base.bytes().all(allowed));
            let ids: Vec<&str> = users.split(',').collect();
            assert!(ids.len() > MAX_LIMITED_USERS || !ids.iter().all(|id| user_ok(id)), "{s:?}");
        }
    }
}

/// `check_data` agrees with serde_json: where serde_json decodes every
/// string of `data` (so it has no lone surrogate) the depth it walks is the
/// one `check_data` measures, and a lone surrogate is something serde_json
/// refuses too.
fn data_invariants(data: &RawValue) {
    // serde_json refuses 1e400, and anything deeper than its own limit.
    if let Ok(Depth(depth)) = serde_json::from_str::<Depth>(data.get()) {
        let verdict = check_data(data, MAX_DATA_DEPTH_LIMIT);
        assert!(verdict.is_ok() == (depth <= MAX_DATA_DEPTH_LIMIT), "{verdict:?} at depth {depth}");
        assert_eq!(check_data(data, depth), Ok(()));
        if depth > 0 {
            assert_eq!(check_data(data, depth - 1), Err(DataError::TooDeep { max: depth - 1 }));
        }
    }
    if let Err(DataError::LoneSurrogate { at }) = check_data(data, usize::MAX) {
        assert!(serde_json::from_str::<Depth>(data.get()).is_err());
        assert!(data.get()[at..].starts_with("\\u"), "points at the escape");
    }
}

/// The nesting depth of a JSON text, walked by serde_json: every key and
/// every element counts (a JSON value would keep only the last of duplicate
/// keys), and every string is decoded (so a lone surrogate is an error).
struct Depth(usize);

impl<'de> Deserialize<'de> for Depth {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Depth;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("JSON")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Depth, E> {
                Ok(Depth(0))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Depth, E> {
                Ok(Depth(0))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Depth, E> {
                Ok(Depth(0))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Depth, E> {
                Ok(Depth(0))
            }
            fn visit_str<E>(self, _: &str) -> Result<Depth, E> {
                Ok(Depth(0))
            }
            fn visit_unit<E>(self) -> Result<Depth, E> {
                Ok(Depth(0))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Depth, A::Error> {
                let mut max = 0;
                while let Some(Depth(d)) = seq.next_element()? {
                    max = max.max(d);
                }
                Ok(Depth(max + 1))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Depth, A::Error> {
                let mut max = 0;
                while let Some((_, Depth(d))) = map.next_entry::<std::borrow::Cow<'de, str>, Depth>()? {
                    max = max.max(d);
                }
                Ok(Depth(max + 1))
            }
        }
        d.deserialize_any(V)
    }
}

/// The frame made at append, its redelivered form and a history page all
/// carry `data` exactly as published.
fn served_as_published(channel: &ChannelName, data: &RawValue, meta: Option<&Meta>) {
    let frame = encode_message_frame(channel, Some(7), "0190b2a1-7c3e-7000-8000-000000000001", 5, data, meta);
    let stored = StoredFrame::parse(&frame).expect("a frame we made reads back");
    assert_eq!(stored.data.map(RawValue::get), Some(data.get()));
    assert_eq!((stored.seq, stored.ts, stored.meta.as_ref()), (Some(7), 5, meta));

    let again = mark_redelivered(&frame, 2);
    let redelivered = StoredFrame::parse(&again).expect("a redelivered frame reads back");
    assert_eq!(redelivered.data.map(RawValue::get), Some(data.get()));

    let page =
        HistoryPage { channel: channel.as_str(), epoch: "e", first: 7, head: 7, messages: vec![stored] };
    let bytes = page.encode();
    #[derive(Deserialize)]
    struct Page<'a> {
        #[serde(borrow)]
        messages: Vec<Msg<'a>>,
    }
    #[derive(Deserialize)]
    struct Msg<'a> {
        #[serde(borrow)]
        data: &'a RawValue,
    }
    let read: Page<'_> = serde_json::from_slice(&bytes).expect("a history page reads back");
    assert_eq!(read.messages[0].data.get(), data.get());
}

/// Run `harness` over the seeds and kept regression inputs of the fuzz
/// target `target` (`fuzz/seeds/<target>`, `fuzz/regressions/<target>`),
/// as `cargo test` replays them without the fuzzer; every crate's harness
/// tests call it. Fails on a target without seeds, and names the input
/// that panics.
pub fn replay(target: &str, harness: fn(&[u8])) {
    let fuzz = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut files = Vec::new();
    for dir in ["seeds", "regressions"] {
        if let Ok(entries) = std::fs::read_dir(fuzz.join(dir).join(target)) {
            files.extend(entries.map(|e| e.expect("readable dir").path()).filter(|p| p.is_file()));
        }
    }
    files.sort();
    assert!(!files.is_empty(), "fuzz/seeds/{target} has seeds");
    for f in files {
        let bytes = std::fs::read(&f).expect("readable input");
        let result = std::panic::catch_unwind(|| harness(&bytes));
        assert!(result.is_ok(), "{} fails", f.display());
    }
}

#[cfg(test)]
mod tests {
    use super::replay;

    #[test]
    fn client_frame_inputs_pass() {
        replay("client_frame", super::client_frame);
    }

    #[test]
    fn publish_body_inputs_pass() {
        replay("publish_body", super::publish_body);
    }

    #[test]
    fn centrifugo_protobuf_inputs_pass() {
        replay("centrifugo_protobuf", super::centrifugo_protobuf);
    }

    #[test]
    fn channel_name_inputs_pass() {
        replay("channel_name", super::channel_name);
    }
}
