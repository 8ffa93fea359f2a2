use std::collections::BTreeMap;

use prost::Message as _;
use serde_json::value::RawValue;

use super::*;
use crate::centrifugo::{self as cf, Answer, ClientInfo, Command, Empty, Method, Publication, Push, Reply};
use crate::{encode_frame, ChannelName, ErrorCode, FrameKind};

const MAX: usize = 64 * 1024;

fn frame_of(commands: &[pb::Command]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in commands {
        append(&mut out, c);
    }
    out
}

/// The commands of a frame as the session gets them.
fn methods(frame: &[u8]) -> Vec<(u32, Method)> {
    decode_commands(frame, MAX)
        .map(|c| {
            let c = Command::try_from(c.expect("decodes")).expect("converts");
            (c.id, c.method())
        })
        .collect()
}

fn replies(frame: &[u8]) -> Vec<pb::Reply> {
    decode_replies(frame, MAX).collect::<Result<_, _>>().expect("replies decode")
}

fn raw(json: &str) -> Box<RawValue> {
    RawValue::from_string(json.to_owned()).unwrap()
}

#[test]
fn every_command_kind_in_one_frame_becomes_the_session_command() {
    let publish_data = b"{\"a\" :\n [1, \"x\"]}".to_vec();
    let commands = [
        pb::Command {
            id: 1,
            connect: Some(pb::ConnectRequest {
                token: "t".into(),
                name: "swift".into(),
                version: "1".into(),
                ..Default::default()
            }),
            ..Default::default()
        },
        pb::Command {
            id: 2,
            subscribe: Some(pb::SubscribeRequest {
                channel: "chat:1".into(),
                recover: true,
                offset: 5,
                epoch: "e".into(),
                ..Default::default()
            }),
            ..Default::default()
        },
        pb::Command {
            id: 3,
            unsubscribe: Some(pb::UnsubscribeRequest { channel: "chat:1".into() }),
            ..Default::default()
        },
        pb::Command {
            id: 4,
            publish: Some(pb::PublishRequest {
                channel: "chat:1".into(),
                data: publish_data.clone(),
                ..Default::default()
            }),
            ..Default::default()
        },
        pb::Command {
            id: 5,
            presence: Some(pb::PresenceRequest { channel: "p".into() }),
            ..Default::default()
        },
        pb::Command {
            id: 6,
            presence_stats: Some(pb::PresenceStatsRequest { channel: "s".into() }),
            ..Default::default()
        },
        pb::Command {
            id: 7,
            history: Some(pb::HistoryRequest {
                channel: "h".into(),
                limit: -1,
                since: Some(pb::StreamPosition { offset: 9, epoch: "e2".into() }),
                reverse: true,
            }),
            ..Default::default()
        },
        pb::Command { id: 8, ping: Some(pb::PingRequest {}), ..Default::default() },
        pb::Command { id: 9, refresh: Some(pb::RefreshRequest { token: "t2".into() }), ..Default::default() },
        pb::Command { id: 10, rpc: Some(pb::RpcRequest::default()), ..Default::default() },
        pb::Command { id: 11, send: Some(pb::SendRequest::default()), ..Default::default() },
        pb::Command { id: 12, sub_refresh: Some(pb::SubRefreshRequest::default()), ..Default::default() },
        pb::Command::default(),
    ];
    let got = methods(&frame_of(&commands));
    assert_eq!(got.len(), commands.len());
    let ids: Vec<u32> = got.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0]);
    let mut got = got.into_iter().map(|(_, m)| m);
    let mut next = || got.next().unwrap();
    assert!(matches!(next(), Method::Connect(c) if c.token == "t" && c.name == "swift" && c.version == "1"));
    assert!(matches!(next(),
        Method::Subscribe(s) if s.channel == "chat:1" && s.recover && s.offset == 5 && s.epoch == "e"));
    assert!(matches!(next(), Method::Unsubscribe(u) if u.channel == "chat:1"));
    match next() {
        // `data` byte for byte, inner whitespace and all.
        Method::Publish(p) => {
            assert_eq!((p.channel.as_str(), p.data.get().as_bytes()), ("chat:1", &publish_data[..]))
        }
        m => panic!("{m:?}"),
    }
    assert!(matches!(next(), Method::Presence(p) if p.channel == "p"));
    assert!(matches!(next(), Method::PresenceStats(p) if p.channel == "s"));
    match next() {
        Method::History(h) => {
            assert_eq!((h.channel.as_str(), h.limit, h.reverse), ("h", -1, true));
            let since = h.since.unwrap();
            assert_eq!((since.offset, since.epoch.as_str()), (9, "e2"));
        }
        m => panic!("{m:?}"),
    }
    assert!(matches!(next(), Method::Ping));
    assert!(matches!(next(), Method::Refresh(r) if r.token == "t2"));
    for _ in 0..3 {
        assert!(matches!(next(), Method::NotAvailable));
    }
    assert!(matches!(next(), Method::Pong));
}

#[test]
fn ping_and_pong_are_one_empty_message() {
    assert_eq!(PING, [0]);
    assert!(matches!(&methods(PING)[..], [(0, Method::Pong)]));
    assert_eq!(replies(PING), [pb::Reply::default()]);
    assert_eq!(frame_of(&[pb::Command::default()]), PING);
    assert!(methods(b"").is_empty(), "an empty frame holds no message");
}

#[test]
fn a_message_split_across_two_frames_is_truncated_in_the_first() {
    let first = pb::Command { id: 1, ping: Some(pb::PingRequest {}), ..Default::default() };
    let second = pb::Command {
        id: 2,
        presence: Some(pb::PresenceRequest { channel: "room:1".into() }),
        ..Default::default()
    };
    let at = frame_of(std::slice::from_ref(&first)).len();
    let whole = frame_of(&[first, second]);
    for cut in at + 1..whole.len() {
        let got: Vec<_> = decode_commands(&whole[..cut], MAX).collect();
        assert_eq!(got.len(), 2, "cut at {cut}");
        assert_eq!(got[0].as_ref().unwrap().id, 1);
        assert!(
            matches!(got[1], Err(FrameError::Truncated { at: a }) if a == at),
            "cut at {cut}: {:?}",
            got[1]
        );
        // The next frame starts inside the message: never the command sent.
        let rest: Vec<_> = decode_commands(&whole[cut..], MAX).collect();
        assert!(!rest.iter().any(|c| c.as_ref().is_ok_and(|c| c.id == 2 && c.presence.is_some())));
    }
}

#[test]
fn a_frame_ending_inside_a_length_prefix_is_truncated() {
    let mut frame = Vec::new();
    prost::encoding::encode_varint(300, &mut frame); // two bytes
    assert!(matches!(
        decode_commands(&frame[..1], MAX).collect::<Vec<_>>()[..],
        [Err(FrameError::Truncated { at: 0 })]
    ));
}

#[test]
fn a_length_above_the_limit_is_refused_before_reading() {
    let mut frame = Vec::new();
    prost::encoding::encode_varint(1_000_000, &mut frame);
    frame.extend_from_slice(&[0; 16]);
    assert!(matches!(
        decode_commands(&frame, 1024).collect::<Vec<_>>()[..],
        [Err(FrameError::TooLarge { at: 0, len: 1_000_000, max: 1024 })]
    ));
    let mut huge = Vec::new();
    prost::encoding::encode_varint(u64::MAX, &mut huge);
    assert!(matches!(
        decode_commands(&huge, MAX).collect::<Vec<_>>()[..],
        [Err(FrameError::TooLarge { len: u64::MAX, .. })]
    ));
}

#[test]
fn a_length_longer_than_a_varint_is_refused() {
    let frame = [0xff; 11];
    assert!(matches!(
        decode_commands(&frame, MAX).collect::<Vec<_>>()[..],
        [Err(FrameError::BadLength { at: 0 })]
    ));
}

#[test]
fn invalid_protobuf_ends_the_frame() {
    let mut frame = PING.to_vec();
    // A message of 2 bytes: field 1 (varint) whose varint never ends.
    frame.extend_from_slice(&[2, 0x08, 0x80]);
    frame.extend_from_slice(PING);
    let got: Vec<_> = decode_commands(&frame, MAX).collect();
    assert_eq!(got.len(), 2, "nothing after the first error");
    assert!(got[0].is_ok());
    assert!(matches!(got[1], Err(FrameError::Invalid { at: 1, .. })), "{:?}", got[1]);
    // Wire type 7 does not exist.
    assert!(matches!(decode_commands(&[1, 0x0f], MAX).next(), Some(Err(FrameError::Invalid { .. }))));
}

#[test]
fn unknown_fields_are_ignored() {
    let mut message = pb::Command {
        id: 7,
        presence: Some(pb::PresenceRequest { channel: "c".into() }),
        ..Default::default()
    }
    .encode_to_vec();
    // Field 99 (bytes) on the command, and field 50 (varint) after it.
    prost::encoding::encode_key(99, prost::encoding::WireType::LengthDelimited, &mut message);
    prost::encoding::encode_varint(3, &mut message);
    message.extend_from_slice(b"xyz");
    prost::encoding::encode_key(50, prost::encoding::WireType::Varint, &mut message);
    prost::encoding::encode_varint(1, &mut message);
    let mut frame = Vec::new();
    prost::encoding::encode_varint(message.len() as u64, &mut frame);
    frame.extend_from_slice(&message);
    assert!(matches!(&methods(&frame)[..], [(7, Method::Presence(p))] if p.channel == "c"));
}

#[test]
fn publish_data_must_be_json_text() {
    let publish = |data: &[u8]| {
        let c = pb::Command {
            id: 4,
            publish: Some(pb::PublishRequest {
                channel: "c".into(),
                data: data.to_vec(),
                ..Default::default()
            }),
            ..Default::default()
        };
        Command::try_from(c)
    };
    for bad in [&b""[..], b"{", b"not json", b"1 2"] {
        let err = publish(bad).unwrap_err();
        assert!(matches!(err, CommandError::DataNotJson { id: 4, .. }), "{bad:?}: {err:?}");
        assert_eq!((err.id(), err.code()), (4, ErrorCode::BadData));
    }
    assert!(matches!(publish(b"\"\xff\"").unwrap_err(), CommandError::DataNotUtf8 { id: 4 }));
    // Whitespace around `data` is not part of it, as on the JSON wire.
    let ok = publish(b" [1, 2] ").unwrap();
    assert_eq!(ok.publish.unwrap().data.get(), "[1, 2]");
}

fn publication<'a>(data: &'a RawValue) -> Publication<'a> {
    Publication {
        data,
        info: Some(ClientInfo {
            user: "u".into(),
            client: "c".into(),
            conn_info: Some(serde_json::json!({"n": 1})),
            chan_info: None,
        }),
        offset: 3,
        tags: BTreeMap::from([("herald_id".to_owned(), "id-1".to_owned())]),
        time: 1000,
    }
}

#[test]
fn every_reply_kind_reads_back() {
    let data = raw("{\"x\": [1]}");
    let session = || cf::RefreshResult { client: "cl".into(), version: "v".into(), expires: true, ttl: 30 };
    let mut frame = Vec::new();
    let sent = [
        Reply::error(1, ErrorCode::RateLimited, "slow"),
        Reply::new(
            2,
            Answer::Connect(cf::ConnectResult {
                session: session(),
                ping: 25,
                pong: true,
                subs: Default::default(),
            }),
        ),
        Reply::new(
            3,
            Answer::Subscribe(cf::SubscribeResult {
                recoverable: true,
                positioned: true,
                epoch: "e".into(),
                offset: 9,
                publications: vec![publication(&data)],
                recovered: true,
                was_recovering: true,
            }),
        ),
        Reply::new(4, Answer::Unsubscribe(Empty {})),
        Reply::new(5, Answer::Publish(Empty {})),
        Reply::new(
            6,
            Answer::Presence(cf::PresenceResult {
                presence: BTreeMap::from([(
                    "c1".to_owned(),
                    ClientInfo { user: "u1".into(), ..Default::default() },
                )]),
            }),
        ),
        Reply::new(7, Answer::PresenceStats(cf::PresenceStatsResult { num_clients: 2, num_users: u64::MAX })),
        Reply::new(
            8,
            Answer::History(cf::HistoryResult {
                publications: vec![publication(&data)],
                epoch: "e".into(),
                offset: 9,
            }),
        ),
        Reply::new(9, Answer::Ping(Empty {})),
        Reply::new(10, Answer::Refresh(session())),
    ];
    for r in &sent {
        append_reply(&mut frame, r);
    }
    let got = replies(&frame);
    assert_eq!(got.iter().map(|r| r.id).collect::<Vec<_>>(), (1..=10).collect::<Vec<_>>());

    assert_eq!(
        got[0].error,
        Some(pb::Error { code: cf::error_code::TOO_MANY_REQUESTS, message: "slow".into(), temporary: true })
    );
    let c = got[1].connect.as_ref().unwrap();
    assert_eq!(
        (c.client.as_str(), c.version.as_str(), c.expires, c.ttl, c.ping, c.pong),
        ("cl", "v", true, 30, 25, true)
    );
    let s = got[2].subscribe.as_ref().unwrap();
    assert!(s.recoverable && s.positioned && s.recovered && s.was_recovering);
    assert_eq!((s.epoch.as_str(), s.offset), ("e", 9));
    let p = &s.publications[0];
    assert_eq!(p.data, b"{\"x\": [1]}");
    assert_eq!((p.offset, p.time, p.tags["herald_id"].as_str()), (3, 1000, "id-1"));
    let info = p.info.as_ref().unwrap();
    assert_eq!(
        (info.user.as_str(), info.client.as_str(), &info.conn_info[..]),
        ("u", "c", &b"{\"n\":1}"[..])
    );
    assert!(info.chan_info.is_empty());
    assert_eq!(got[3].unsubscribe, Some(pb::UnsubscribeResult {}));
    assert_eq!(got[4].publish, Some(pb::PublishResult {}));
    assert_eq!(got[5].presence.as_ref().unwrap().presence["c1"].user, "u1");
    assert_eq!(got[6].presence_stats, Some(pb::PresenceStatsResult { num_clients: 2, num_users: u32::MAX }));
    let h = got[7].history.as_ref().unwrap();
    assert_eq!((h.epoch.as_str(), h.offset, &h.publications[0].data[..]), ("e", 9, &b"{\"x\": [1]}"[..]));
    assert_eq!(got[8].ping, Some(pb::PingResult {}));
    assert_eq!(
        got[9].refresh,
        Some(pb::RefreshResult { client: "cl".into(), version: "v".into(), expires: true, ttl: 30 })
    );
}

#[test]
fn pushes_read_back() {
    let info = ClientInfo { user: "u1".into(), client: "c1".into(), ..Default::default() };
    let mut frame = Vec::new();
    append_push(
        &mut frame,
        &Push { join: Some(cf::JoinLeave { info: info.clone() }), ..Push::new("room:1") },
    );
    append_push(&mut frame, &Push { leave: Some(cf::JoinLeave { info }), ..Push::new("room:1") });
    append_push(
        &mut frame,
        &Push {
            unsubscribe: Some(cf::Unsubscribe {
                code: cf::unsubscribe_code::SERVER,
                reason: "closed".into(),
            }),
            ..Push::new("room:1")
        },
    );
    append_push(
        &mut frame,
        &Push {
            subscribe: Some(cf::SubscribePush {
                recoverable: true,
                epoch: "e1".into(),
                offset: 7,
                positioned: true,
            }),
            ..Push::new("room:1")
        },
    );
    let got: Vec<pb::Push> = replies(&frame).into_iter().map(|r| r.push.expect("a push")).collect();
    assert!(got.iter().all(|p| p.channel == "room:1"));
    assert_eq!(
        got[3].subscribe,
        Some(pb::Subscribe {
            recoverable: true,
            epoch: "e1".into(),
            offset: 7,
            positioned: true,
            data: vec![]
        })
    );
    assert_eq!(got[0].join.as_ref().unwrap().info.as_ref().unwrap().client, "c1");
    assert_eq!(got[1].leave.as_ref().unwrap().info.as_ref().unwrap().user, "u1");
    assert_eq!(got[2].unsubscribe, Some(pb::Unsubscribe { code: 2000, reason: "closed".into() }));
}

/// What prost writes for the push `append_pub_push` writes by hand.
fn prost_pub_push(
    channel: &str,
    data: &[u8],
    offset: u64,
    tags: &BTreeMap<String, String>,
    time: u64,
) -> Vec<u8> {
    let publication = pb::Publication {
        data: data.to_vec(),
        offset,
        tags: tags.clone(),
        time: time.min(i64::MAX as u64) as i64,
        ..Default::default()
    };
    let reply = pb::Reply {
        push: Some(pb::Push { channel: channel.into(), r#pub: Some(publication), ..Default::default() }),
        ..Default::default()
    };
    reply.encode_length_delimited_to_vec()
}

#[test]
fn a_pub_push_from_parts_is_what_prost_writes() {
    let long = "x".repeat(300);
    let tag_sets = [
        BTreeMap::new(),
        BTreeMap::from([("herald_id".to_owned(), "id".to_owned()), ("trace".to_owned(), long.clone())]),
        BTreeMap::from([(String::new(), "v".to_owned()), ("k".to_owned(), String::new())]),
    ];
    for channel in ["chat:1", ""] {
        for data in [&b""[..], b"null", long.as_bytes()] {
            for offset in [0, 1, u64::MAX] {
                for time in [0, 1_700_000_000_000, u64::MAX] {
                    for tags in &tag_sets {
                        let mut out = vec![9]; // appends after what is there
                        append_pub_push(&mut out, channel, data, offset, tags, time);
                        let want = prost_pub_push(channel, data, offset, tags, time);
                        assert_eq!(out[1..], want[..], "{channel:?} {offset} {time} {tags:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn a_message_frame_becomes_a_pub_push_with_data_byte_for_byte() {
    let ch = ChannelName::new("chat:1").unwrap();
    let data = raw("{\"a\" :\n [1, \"x\\ny\"]}");
    let meta = crate::Meta::from([("trace".to_owned(), "t1".to_owned())]);
    let frame = encode_frame(FrameKind::Message, &ch, Some(7), "id-1", 1000, &data, Some(&meta));
    let got = replies(&push_of_frame("chat:1", &frame).unwrap());
    let [reply] = &got[..] else { panic!("one message: {got:?}") };
    let push = reply.push.as_ref().unwrap();
    assert_eq!(push.channel, "chat:1");
    let p = push.r#pub.as_ref().unwrap();
    assert_eq!(p.data, data.get().as_bytes());
    assert_eq!((p.offset, p.time), (7, 1000));
    assert_eq!(p.tags, BTreeMap::from([("herald_id".into(), "id-1".into()), ("trace".into(), "t1".into())]));

    let room = encode_frame(FrameKind::Room, &ch, None, "id-2", 5, &data, None);
    let got = replies(&push_of_frame("chat:1", &room).unwrap());
    let p = got[0].push.as_ref().unwrap().r#pub.as_ref().unwrap();
    assert_eq!((p.offset, p.tags["herald_type"].as_str()), (0, "room"));
}

#[test]
fn presence_frames_become_join_and_leave_pushes() {
    let ch = ChannelName::new("room:1").unwrap();
    let member = raw(r#"{"client_id":"c1","user":"u1","info":{"n":1}}"#);
    for (kind, join) in [(FrameKind::Join, true), (FrameKind::Leave, false)] {
        let frame = encode_frame(kind, &ch, None, "id", 1, &member, None);
        let got = replies(&push_of_frame("room:1", &frame).unwrap());
        let push = got[0].push.as_ref().unwrap();
        let info = if join { &push.join.as_ref().unwrap().info } else { &push.leave.as_ref().unwrap().info };
        let info = info.as_ref().unwrap();
        assert_eq!(
            (info.user.as_str(), info.client.as_str(), &info.conn_info[..]),
            ("u1", "c1", &b"{\"n\":1}"[..])
        );
    }
    assert_eq!(push_of_frame("room:1", b"not a frame"), None);
}
