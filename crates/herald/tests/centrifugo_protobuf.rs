//! The Centrifugo endpoint's Protobuf wire through real sockets: the
//! negotiation (query or subprotocol, echoed), binary frames of
//! length-prefixed commands answered in order, pushes and pings.

use futures_util::{SinkExt, StreamExt};
use herald_proto::centrifugo_pb::{self as cf_pb, pb};
use herald_test_support::*;
use tokio_websockets::{MaybeTlsStream, Message, WebSocketStream};

type Socket = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

/// A raw Centrifugo Protobuf client: commands out, replies and pushes in.
struct Pb {
    ws: Socket,
    next_id: u32,
    inbox: std::collections::VecDeque<pb::Reply>,
}

impl Pb {
    async fn dial(srv: &TestServer, query: &str, subprotocol: Option<&str>) -> (Self, http::Response<()>) {
        let url = format!("ws://{}/connection/websocket{query}", srv.addr);
        let mut builder = tokio_websockets::ClientBuilder::new().uri(&url).unwrap();
        if let Some(p) = subprotocol {
            builder = builder
                .add_header(http::header::SEC_WEBSOCKET_PROTOCOL, http::HeaderValue::from_str(p).unwrap())
                .unwrap();
        }
        let (ws, resp) = builder.connect().await.expect("dial");
        (Pb { ws, next_id: 0, inbox: Default::default() }, resp)
    }

    /// Send commands in one binary frame; returns their ids.
    async fn send(&mut self, cmds: Vec<pb::Command>) -> Vec<u32> {
        let mut ids = Vec::new();
        let mut frame = Vec::new();
        for mut c in cmds {
            self.next_id += 1;
            c.id = self.next_id;
            ids.push(c.id);
            cf_pb::append(&mut frame, &c);
        }
        self.ws.send(Message::binary(frame)).await.expect("send");
        ids
    }

    /// The next message the server sent (every frame must be binary).
    async fn next(&mut self) -> pb::Reply {
        loop {
            if let Some(r) = self.inbox.pop_front() {
                return r;
            }
            let msg = tokio::time::timeout(WAIT, self.ws.next()).await.expect("frame in time");
            let msg = msg.expect("socket open").expect("frame");
            if msg.is_ping() || msg.is_pong() {
                continue;
            }
            assert!(msg.is_binary(), "a text frame on the Protobuf wire");
            let payload = msg.as_payload().to_vec();
            for r in cf_pb::decode_replies(&payload, payload.len()) {
                self.inbox.push_back(r.expect("a reply that decodes"));
            }
        }
    }

    /// The reply to `id`; pushes read meanwhile are dropped.
    async fn reply(&mut self, id: u32) -> pb::Reply {
        loop {
            let r = self.next().await;
            if r.id == id {
                return r;
            }
        }
    }

    async fn call(&mut self, cmd: pb::Command) -> pb::Reply {
        let id = self.send(vec![cmd]).await[0];
        self.reply(id).await
    }
}

fn connect() -> pb::Command {
    pb::Command { connect: Some(Default::default()), ..Default::default() }
}

fn subscribe(channel: &str) -> pb::Command {
    pb::Command {
        subscribe: Some(pb::SubscribeRequest { channel: channel.into(), ..Default::default() }),
        ..Default::default()
    }
}

fn publish(channel: &str, data: &str) -> pb::Command {
    pb::Command {
        publish: Some(pb::PublishRequest {
            channel: channel.into(),
            data: data.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn the_subprotocol_picks_protobuf_and_is_echoed() {
    let srv = TestServer::start().await;
    let (mut c, resp) = Pb::dial(&srv, "?user=u1", Some("centrifuge-protobuf")).await;
    let echoed =
        resp.headers().get(http::header::SEC_WEBSOCKET_PROTOCOL).map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(echoed.as_deref(), Some("centrifuge-protobuf"));
    let r = c.call(connect()).await;
    assert!(r.error.is_none(), "{r:?}");
    assert!(!r.connect.expect("connect result").client.is_empty());

    // The JSON subprotocol is echoed too, and the wire stays JSON.
    let (mut j, resp) = Pb::dial(&srv, "?user=u2", Some("centrifuge-json")).await;
    let echoed =
        resp.headers().get(http::header::SEC_WEBSOCKET_PROTOCOL).map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(echoed.as_deref(), Some("centrifuge-json"));
    j.ws.send(Message::text(r#"{"id":1,"connect":{}}"#)).await.unwrap();
    let msg = tokio::time::timeout(WAIT, j.ws.next()).await.unwrap().unwrap().unwrap();
    assert!(msg.as_text().is_some_and(|t| t.contains("\"connect\"")), "{msg:?}");
}

#[tokio::test]
async fn commands_in_one_binary_frame_are_answered_in_order_and_pushed() {
    let srv = TestServer::start().await;
    for query in ["?user=u1&format=protobuf", "?user=u1&cf_protocol=protobuf"] {
        let (mut c, resp) = Pb::dial(&srv, query, None).await;
        assert!(resp.headers().get(http::header::SEC_WEBSOCKET_PROTOCOL).is_none());
        let channel = if query.contains("format") { "chat:pb1" } else { "chat:pb2" };
        let ids = c
            .send(vec![
                connect(),
                subscribe(channel),
                publish(channel, r#"{"n":1}"#),
                // Not JSON: an error reply, the connection stays.
                publish(channel, "not json"),
                pb::Command { ping: Some(pb::PingRequest {}), ..Default::default() },
            ])
            .await;
        let mut replies = Vec::new();
        let mut pushes = Vec::new();
        while replies.len() < ids.len() {
            let r = c.next().await;
            if r.id == 0 {
                pushes.push(r);
            } else {
                replies.push(r);
            }
        }
        let got: Vec<u32> = replies.iter().map(|r| r.id).collect();
        assert_eq!(got, ids);
        assert!(replies[0].connect.is_some(), "{:?}", replies[0]);
        let sub = replies[1].subscribe.as_ref().expect("subscribe result");
        assert!(sub.recoverable && sub.positioned);
        assert!(replies[2].publish.is_some(), "{:?}", replies[2]);
        assert!(replies[3].error.is_some(), "{:?}", replies[3]);
        assert!(replies[4].ping.is_some(), "{:?}", replies[4]);
        // The subscriber gets its own publish as a push, data byte for byte.
        let push = match pushes.pop() {
            Some(p) => p,
            None => c.next().await,
        };
        let push = push.push.expect("a push");
        assert_eq!(push.channel, channel);
        let publication = push.r#pub.expect("a publication");
        assert_eq!(publication.offset, 1);
        assert_eq!(publication.data, br#"{"n":1}"#.to_vec());
    }
}

#[tokio::test]
async fn the_server_pings_with_an_empty_message_and_text_frames_close() {
    let srv = TestServer::start_with(|c| {
        c.heartbeat.ping_interval = std::time::Duration::from_millis(200);
        c.heartbeat.idle_timeout = std::time::Duration::from_secs(10);
    })
    .await;
    let (mut c, _) = Pb::dial(&srv, "?user=u1&format=protobuf", None).await;
    c.call(connect()).await;
    // An empty message: decoded as an empty reply.
    assert_eq!(c.next().await, pb::Reply::default());
    c.ws.send(Message::binary(cf_pb::PING.to_vec())).await.unwrap();
    assert_eq!(c.next().await, pb::Reply::default());
    // A text frame is not this wire's: the connection closes.
    c.ws.send(Message::text("{}")).await.unwrap();
    let code = loop {
        match tokio::time::timeout(WAIT, c.ws.next()).await.expect("close in time") {
            Some(Ok(m)) if m.is_close() => break m.as_close().map(|(code, _)| u16::from(code)),
            Some(Ok(_)) => {}
            other => panic!("no close frame: {other:?}"),
        }
    };
    let bad_request = herald_proto::centrifugo::disconnect_of(herald_proto::close::BAD_REQUEST);
    assert_eq!(code, Some(bad_request));
}

#[tokio::test]
async fn server_side_subscriptions_and_their_recovery_on_the_protobuf_wire() {
    let srv = TestServer::start_with(|c| c.dev = false).await;
    let token = user_token("u1", &["chat:pbss", "chat:more*"], 3600);
    let connect = |subs| pb::Command {
        connect: Some(pb::ConnectRequest { token: token.clone(), subs, ..Default::default() }),
        ..Default::default()
    };
    let (mut c, _) = Pb::dial(&srv, "?format=protobuf", None).await;
    let r = c.call(connect(Default::default())).await;
    let subs = &r.connect.as_ref().expect("connect result").subs;
    assert_eq!(subs.keys().collect::<Vec<_>>(), ["chat:pbss"], "names subscribe, patterns do not");
    let epoch = subs["chat:pbss"].epoch.clone();
    assert!(subs["chat:pbss"].recoverable && !epoch.is_empty());
    for i in 1..=3 {
        srv.publish("chat:pbss", serde_json::json!(i)).await;
    }
    let mut offsets = Vec::new();
    while offsets.len() < 2 {
        let push = c.next().await.push.unwrap_or_default();
        if let Some(p) = push.r#pub {
            assert_eq!(push.channel, "chat:pbss");
            offsets.push(p.offset);
        }
    }
    assert_eq!(offsets, [1, 2]);
    drop(c);
    // The SDK reconnects with the position it saw: the rest is recovered in
    // the connect reply, the data as the stored JSON bytes.
    let (mut c, _) = Pb::dial(&srv, "?format=protobuf", None).await;
    let position = pb::SubscribeRequest { recover: true, offset: 2, epoch, ..Default::default() };
    let r = c.call(connect([("chat:pbss".to_owned(), position)].into())).await;
    let s = &r.connect.as_ref().unwrap().subs["chat:pbss"];
    assert!(s.recovered && s.was_recovering, "{s:?}");
    assert_eq!(
        s.publications.iter().map(|p| (p.offset, p.data.clone())).collect::<Vec<_>>(),
        [(3, b"3".to_vec())]
    );
}

impl Pb {
    /// Read until the server closes; its close code.
    async fn close_code(&mut self) -> Option<u16> {
        loop {
            match tokio::time::timeout(WAIT, self.ws.next()).await.expect("close in time") {
                Some(Ok(m)) if m.is_close() => return m.as_close().map(|(code, _)| u16::from(code)),
                Some(Ok(_)) => {}
                _ => return None,
            }
        }
    }
}

/// Framing faults at the socket: a message cut across two WebSocket frames
/// (each frame must hold whole messages), a length beyond the message
/// limit, each closed as a bad request (3501, the SDKs stop) with nothing
/// of it applied; an unknown field is ignored.
#[tokio::test]
async fn framing_faults_close_and_unknown_fields_pass() {
    let srv = TestServer::start_with(|c| c.websocket.max_message_bytes = 4096).await;
    let bad_request = Some(herald_proto::centrifugo::disconnect_of(herald_proto::close::BAD_REQUEST));

    // An unknown field (99, a varint) after a ping command: answered as a ping.
    let (mut c, _) = Pb::dial(&srv, "?user=u1&format=protobuf", None).await;
    c.call(connect()).await;
    let mut ping = Vec::new();
    let body = {
        use prost::Message as _;
        let mut b =
            pb::Command { id: 7, ping: Some(pb::PingRequest {}), ..Default::default() }.encode_to_vec();
        prost::encoding::encode_key(99, prost::encoding::WireType::Varint, &mut b);
        b.push(1);
        b
    };
    prost::encoding::encode_varint(body.len() as u64, &mut ping);
    ping.extend_from_slice(&body);
    c.ws.send(Message::binary(ping)).await.unwrap();
    assert!(c.reply(7).await.ping.is_some(), "the unknown field is skipped");

    // A publish cut in two frames: the first is truncated.
    let mut whole = Vec::new();
    cf_pb::append(&mut whole, &publish("chat:cut", "1"));
    let (head, tail) = whole.split_at(whole.len() / 2);
    c.ws.send(Message::binary(head.to_vec())).await.unwrap();
    c.ws.send(Message::binary(tail.to_vec())).await.unwrap();
    assert_eq!(c.close_code().await, bad_request);
    assert!(srv.history("chat:cut").await.is_empty(), "nothing of it was published");

    // A length prefix above websocket.max_message_bytes.
    let (mut c, _) = Pb::dial(&srv, "?user=u2&format=protobuf", None).await;
    c.call(connect()).await;
    let mut huge = Vec::new();
    prost::encoding::encode_varint(1 << 20, &mut huge);
    huge.extend_from_slice(&[0; 16]);
    c.ws.send(Message::binary(huge)).await.unwrap();
    assert_eq!(c.close_code().await, bad_request);
}
