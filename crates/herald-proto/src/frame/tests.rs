use serde_json::value::RawValue;

use super::client::*;
use super::server::*;
use super::*;
use crate::{ChannelName, ErrorCode};

#[test]
fn parses_every_client_frame() {
    let f = ClientFrame::parse(
        r#"{"type":"subscribe","req":1,"channel":"chat:1","since":{"seq":3,"epoch":"E"}}"#,
    )
    .unwrap();
    match f {
        ClientFrame::Subscribe { req, channel, since, .. } => {
            assert_eq!(req, Some(1));
            assert_eq!(channel.as_str(), "chat:1");
            assert_eq!(since, Some(Since { seq: 3, epoch: Some("E".into()) }));
        }
        other => panic!("{other:?}"),
    }
    let f = ClientFrame::parse(
        r#"{"type":"publish","req":3,"channel":"chat:1","data":{"a":[1, 2]},"idempotency_key":"k1"}"#,
    )
    .unwrap();
    match f {
        ClientFrame::Publish { data, idempotency_key, .. } => {
            assert_eq!(data.get(), r#"{"a":[1, 2]}"#, "data is kept raw, byte for byte");
            assert_eq!(idempotency_key.as_deref(), Some("k1"));
        }
        other => panic!("{other:?}"),
    }
    match ClientFrame::parse(r#"{"type":"publish","channel":"chat:1","data":null}"#).unwrap() {
        ClientFrame::Publish { data, .. } => assert_eq!(data.get(), "null"),
        other => panic!("{other:?}"),
    }
    // `type` and `channel` are read in place when they can be, and still
    // decoded when they are written with escapes.
    match ClientFrame::parse(r#"{"type":"publ\u0069sh","channel":"chat:\u0031\/x","data":1}"#) {
        Err(e) => assert_eq!(e.code, ErrorCode::BadChannel, "`/` is not in the alphabet"),
        other => panic!("{other:?}"),
    }
    match ClientFrame::parse(r#"{"type":"publ\u0069sh","channel":"chat:\u0031","data":1}"#).unwrap() {
        ClientFrame::Publish { channel, .. } => assert_eq!(channel.as_str(), "chat:1"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        ClientFrame::parse(r#"{"type":"ping","req":4}"#),
        Ok(ClientFrame::Ping { req: Some(4) })
    ));
    assert!(matches!(
        ClientFrame::parse(r#"{"type":"ack","channel":"user:1","seq":15}"#),
        Ok(ClientFrame::Ack { seq: 15, .. })
    ));
}

#[test]
fn errors_are_precise_and_echo_req() {
    let e = ClientFrame::parse("{not json").unwrap_err();
    assert_eq!(e.code, ErrorCode::BadJson);
    let e = ClientFrame::parse(r#"{"type":"subscribe","req":9}"#).unwrap_err();
    assert_eq!((e.code, e.req), (ErrorCode::BadRequest, Some(9)));
    let e = ClientFrame::parse(r#"{"type":"subscribe","req":9,"channel":"a b"}"#).unwrap_err();
    assert_eq!(e.code, ErrorCode::BadChannel);
    let e = ClientFrame::parse(r#"{"type":"frobnicate","req":2}"#).unwrap_err();
    assert_eq!((e.code, e.req), (ErrorCode::BadRequest, Some(2)));
    let e = ClientFrame::parse(r#"{"type":"publish","req":5,"channel":"chat:1","data":1,"req":"x"}"#);
    assert!(e.is_err());
}

#[test]
fn message_frame_round_trips() {
    let ch = ChannelName::new("chat:1").unwrap();
    let data = RawValue::from_string(r#"{"text":"hi"}"#.into()).unwrap();
    let mut meta = Meta::new();
    meta.insert("trace_id".into(), "t1".into());
    let bytes = encode_message_frame(&ch, Some(4), "id-1", 1700, &data, Some(&meta));
    let v = MessageView::parse(&bytes).unwrap();
    assert_eq!(v.kind, "message");
    assert_eq!(v.seq, Some(4));
    assert_eq!(v.data.unwrap().get(), r#"{"text":"hi"}"#);
    assert_eq!(v.meta.unwrap()["trace_id"], "t1");
}

#[test]
fn event_frames_carry_their_type_and_body_field() {
    let ch = ChannelName::new("room:1").unwrap();
    let member = RawValue::from_string(r#"{"client_id":"c","user":"u"}"#.into()).unwrap();
    let v = MessageView::parse(&encode_frame(FrameKind::Join, &ch, None, "i", 1, &member, None)).unwrap();
    assert_eq!(v.kind, "join");
    assert_eq!(v.member.unwrap().client_id, "c");
    assert!(v.data.is_none() && v.seq.is_none());
    let state = RawValue::from_string(r#"{"state":"live"}"#.into()).unwrap();
    let v = MessageView::parse(&encode_frame(FrameKind::Room, &ch, Some(3), "i", 1, &state, None)).unwrap();
    assert_eq!((v.kind.as_str(), v.seq), ("room", Some(3)));
    assert_eq!(v.data.unwrap().get(), r#"{"state":"live"}"#);
    for k in [FrameKind::Message, FrameKind::Room, FrameKind::Join, FrameKind::Leave] {
        assert_eq!(FrameKind::parse(k.as_str()), Some(k));
    }
}

#[test]
fn subscribe_checks_presence_fields() {
    let f =
        ClientFrame::parse(r#"{"type":"subscribe","channel":"room:1","client_id":"tab-1","info":{"n":"A"}}"#);
    match f.unwrap() {
        ClientFrame::Subscribe { client_id, info, .. } => {
            assert_eq!(client_id.as_deref(), Some("tab-1"));
            assert_eq!(info.unwrap().get(), r#"{"n":"A"}"#);
        }
        other => panic!("{other:?}"),
    }
    let long = "x".repeat(MAX_CLIENT_ID_LEN + 1);
    let e = ClientFrame::parse(&format!(
        r#"{{"type":"subscribe","req":2,"channel":"room:1","client_id":"{long}"}}"#
    ))
    .unwrap_err();
    assert_eq!((e.code, e.req), (ErrorCode::BadRequest, Some(2)));
    let big =
        format!(r#"{{"type":"subscribe","channel":"room:1","info":"{}"}}"#, "y".repeat(MAX_MEMBER_INFO_LEN));
    assert_eq!(ClientFrame::parse(&big).unwrap_err().code, ErrorCode::BadRequest);
}

#[test]
fn redelivered_frames_keep_every_field_and_add_the_marker() {
    let ch = ChannelName::new("user:1").unwrap();
    let data = RawValue::from_string(r#"{"n":1}"#.into()).unwrap();
    let frame = encode_message_frame(&ch, Some(7), "id-7", 5, &data, None);
    let v = MessageView::parse(&mark_redelivered(&frame, 3)).unwrap();
    assert_eq!((v.seq, v.redelivered, v.attempt), (Some(7), Some(true), Some(3)));
    assert_eq!(v.data.unwrap().get(), r#"{"n":1}"#);
}

#[test]
fn stored_frames_read_in_place_and_garbage_is_an_error() {
    let ch = ChannelName::new("chat:1").unwrap();
    let data = RawValue::from_string("{ \"b\" : 1e400, \"a\": 1 }".into()).unwrap();
    let frame = encode_message_frame(&ch, Some(3), "i", 9, &data, None);
    let f = StoredFrame::parse(&frame).unwrap();
    assert_eq!((f.kind.as_str(), f.seq, f.ts), ("message", Some(3), 9));
    assert_eq!(f.data.unwrap().get(), data.get());
    assert_eq!(
        serde_json::to_string(&f).unwrap(),
        format!(r#"{{"type":"message","seq":3,"id":"i","ts":9,"data":{}}}"#, data.get())
    );
    let null = RawValue::from_string("null".into()).unwrap();
    let frame = encode_message_frame(&ch, Some(4), "i", 9, &null, None);
    assert_eq!(StoredFrame::parse(&frame).unwrap().data.map(RawValue::get), Some("null"));
    assert_eq!(MessageView::parse(&frame).unwrap().data.map(|d| d.get().to_owned()).as_deref(), Some("null"));
    assert_eq!(MessageView::parse(br#"{"type":"pong"}"#).unwrap().data.map(|d| d.get().to_owned()), None);
    for garbage in [&b""[..], b"{", b"\xff", br#"{"type":"message"}"#, br#"[1]"#] {
        assert!(StoredFrame::parse(garbage).is_err());
    }
}

#[test]
fn ok_frame_omits_irrelevant_fields() {
    let ok = OkFrame { req: Some(1), seq: Some(8), duplicate: Some(false), ..Default::default() };
    assert_eq!(String::from_utf8(ok.encode()).unwrap(), r#"{"type":"ok","req":1,"seq":8,"duplicate":false}"#);
}

#[test]
fn tagged_frames_without_fields_and_with_escapes_are_valid_json() {
    assert_eq!(String::from_utf8(OkFrame::default().encode()).unwrap(), r#"{"type":"ok"}"#);
    assert_eq!(String::from_utf8(encode_pong(None)).unwrap(), r#"{"type":"pong"}"#);
    assert_eq!(String::from_utf8(encode_pong(Some(3))).unwrap(), r#"{"type":"pong","req":3}"#);
    let err =
        ErrorFrame { req: None, code: ErrorCode::BadRequest, message: "a \"quote\"\n".into(), channel: None };
    let v: serde_json::Value = serde_json::from_slice(&err.encode()).unwrap();
    assert_eq!((v["type"].as_str(), v["message"].as_str()), (Some("error"), Some("a \"quote\"\n")));
}

#[test]
fn every_encoded_client_frame_parses_back() {
    let data = RawValue::from_string(r#"{ "b" : 1e400, "a":[1] }"#.into()).unwrap();
    let info = RawValue::from_string(r#"{"n":"A"}"#.into()).unwrap();
    let mut meta = Meta::new();
    meta.insert("trace_id".into(), "t".into());
    let since = Some(Since { seq: 3, epoch: Some("E".into()) });
    let sub = OutFrame::Subscribe {
        req: Some(1),
        channel: "room:1",
        since: since.clone(),
        client_id: Some("tab"),
        info: Some(&info),
    };
    match ClientFrame::parse(&sub.encode()).unwrap() {
        ClientFrame::Subscribe { req, channel, since: s, client_id, info: i } => {
            assert_eq!(
                (req, channel.as_str(), s, client_id.as_deref()),
                (Some(1), "room:1", since, Some("tab"))
            );
            assert_eq!(i.unwrap().get(), info.get());
        }
        other => panic!("{other:?}"),
    }
    let publish = OutFrame::Publish {
        req: Some(2),
        channel: "chat:1",
        data: &data,
        meta: Some(&meta),
        idempotency_key: Some("k"),
    };
    match ClientFrame::parse(&publish.encode()).unwrap() {
        ClientFrame::Publish { req, data: d, meta: m, idempotency_key, .. } => {
            assert_eq!(d.get(), data.get(), "data goes out byte for byte");
            assert_eq!((req, m, idempotency_key.as_deref()), (Some(2), Some(meta.clone()), Some("k")));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        ClientFrame::parse(&OutFrame::Unsubscribe { req: Some(3), channel: "chat:1" }.encode()),
        Ok(ClientFrame::Unsubscribe { req: Some(3), .. })
    ));
    assert!(matches!(
        ClientFrame::parse(&OutFrame::Presence { req: Some(4), channel: "room:1" }.encode()),
        Ok(ClientFrame::Presence { req: Some(4), .. })
    ));
    assert!(matches!(
        ClientFrame::parse(&OutFrame::Ping { req: None }.encode()),
        Ok(ClientFrame::Ping { req: None })
    ));
    let ack = OutFrame::Ack { req: None, channel: "user:1", seq: 5 };
    assert_eq!(ack.encode(), r#"{"type":"ack","channel":"user:1","seq":5}"#);
    assert!(matches!(ClientFrame::parse(&ack.encode()), Ok(ClientFrame::Ack { req: None, seq: 5, .. })));
    assert_eq!(
        OutFrame::Subscribe { req: Some(1), channel: "c", since: None, client_id: None, info: None }.encode(),
        r#"{"type":"subscribe","req":1,"channel":"c"}"#
    );
}

/// `encode_frame` and `OkFrame::encode_published` write their JSON
/// directly; these are the serde_json encodings they must match byte for
/// byte (stored frames are served and replayed as they are).
mod direct_encoding {
    use serde::Serialize;

    use super::*;

    #[derive(Serialize)]
    struct Reference<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        channel: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        seq: Option<u64>,
        id: &'a str,
        ts: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<&'a RawValue>,
        #[serde(skip_serializing_if = "Option::is_none")]
        member: Option<&'a RawValue>,
        #[serde(skip_serializing_if = "Option::is_none")]
        meta: Option<&'a Meta>,
    }

    const IDS: [&str; 5] = [
        "0190b2a1-7c3e-7000-8000-000000000001",
        "",
        "quote\" back\\slash",
        "tab\tnewline\n\u{1} del\u{7f}",
        "é ✓ 𝄞",
    ];

    #[test]
    fn message_frames_are_the_bytes_serde_json_writes() {
        let channels = ["chat:1", "live:a.b-c_d@e=f", "x"];
        let bodies = [r#"{"n":1,"p":"x"}"#, r#"[1, 2 ,"\u00e9\n"]"#, "null", r#""str""#, "1e400"];
        let mut meta = Meta::new();
        meta.insert("k\"ey".into(), "v\\al\nue".into());
        meta.insert("a".into(), "é".into());
        let metas = [None, Some(&meta), Some(&Meta::new())];
        let kinds = [FrameKind::Message, FrameKind::Room, FrameKind::Join, FrameKind::Leave];
        let mut n = 0;
        for kind in kinds {
            for channel in channels {
                let ch = ChannelName::new(channel).unwrap();
                for id in IDS {
                    for body in bodies {
                        let body = RawValue::from_string(body.to_owned()).unwrap();
                        for seq in [None, Some(0), Some(u64::MAX)] {
                            for meta in metas {
                                let (data, member) = match kind.body_field() {
                                    "member" => (None, Some(&*body)),
                                    _ => (Some(&*body), None),
                                };
                                let ts = 1_700_000_000_123 + n;
                                let reference = Reference {
                                    kind: kind.as_str(),
                                    channel,
                                    seq,
                                    id,
                                    ts,
                                    data,
                                    member,
                                    meta,
                                };
                                let expected = serde_json::to_vec(&reference).unwrap();
                                let got = encode_frame(kind, &ch, seq, id, ts, &body, meta);
                                assert_eq!(
                                    String::from_utf8(got).unwrap(),
                                    String::from_utf8(expected).unwrap()
                                );
                                n += 1;
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(n, 4 * 3 * 5 * 5 * 3 * 3);
    }

    #[test]
    fn publish_oks_are_the_bytes_of_their_ok_frame() {
        for req in [None, Some(0), Some(42), Some(u64::MAX)] {
            for channel in ["chat:1", "odd \"name\"\u{2}"] {
                for id in IDS {
                    for seq in [None, Some(7)] {
                        for duplicate in [false, true] {
                            let expected = OkFrame {
                                req,
                                channel: Some(channel.to_owned()),
                                seq,
                                id: Some(id.to_owned()),
                                duplicate: Some(duplicate),
                                ..Default::default()
                            }
                            .encode();
                            let got = OkFrame::encode_published(req, channel, seq, id, duplicate);
                            assert_eq!(String::from_utf8(got).unwrap(), String::from_utf8(expected).unwrap());
                        }
                    }
                }
            }
        }
    }
}
