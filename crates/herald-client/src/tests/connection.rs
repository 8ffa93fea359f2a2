use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{msg, within, FakeServer};
use crate::handshake::expected_accept;
use crate::{Auth, ClientError, ConnectOptions, Connection, ServerEvent};

#[tokio::test]
async fn request_returns_the_matching_reply_and_keeps_other_frames_in_order() {
    within(async {
        let server = FakeServer::start().await;
        let url = server.url();
        let script = tokio::spawn(async move {
            let mut c = server.accept().await;
            let sub = c.recv_type("subscribe").await;
            // Frames that are not the reply arrive first.
            c.send(msg("chat:1", 1)).await;
            c.send(json!({ "type": "pong", "req": 999 })).await;
            c.send(msg("chat:1", 2)).await;
            c.send(json!({ "type": "ok", "req": sub["req"], "channel": "chat:1", "head": 2 })).await;
            c.send(msg("chat:1", 3)).await;
            let ping = c.recv_type("ping").await;
            c.send(json!({ "type": "pong", "req": ping["req"] })).await;
            c
        });

        let mut conn = Connection::connect(&ConnectOptions::dev_user(url, "alice")).await.unwrap();
        let ok = conn.subscribe("chat:1", None).await.unwrap();
        assert_eq!((ok.kind.as_str(), ok.head), ("ok", Some(2)));
        let pong = conn.ping().await.unwrap();
        assert_eq!(pong.kind, "pong");
        assert_ne!(pong.req, ok.req, "each request gets its own req");

        let mut seen = Vec::new();
        for _ in 0..4 {
            let ev = conn.next_frame().await.unwrap().unwrap().into_frame().unwrap();
            seen.push((ev.kind, ev.seq, ev.req));
        }
        assert_eq!(
            seen,
            [
                ("message".into(), Some(1), None),
                ("pong".into(), None, Some(999)),
                ("message".into(), Some(2), None),
                ("message".into(), Some(3), None),
            ]
        );
        drop(script.await.unwrap());
    })
    .await;
}

#[tokio::test]
async fn error_replies_are_returned_and_request_ok_turns_them_into_errors() {
    within(async {
        let server = FakeServer::start().await;
        let url = server.url();
        let script = tokio::spawn(async move {
            let mut c = server.accept().await;
            for _ in 0..2 {
                let f = c.recv_type("publish").await;
                assert_eq!(f["idempotency_key"], "k1");
                c.send(json!({
                    "type": "error", "req": f["req"], "code": "forbidden",
                    "message": "no", "channel": "news:1",
                }))
                .await;
            }
            c
        });
        let mut conn = Connection::connect(&ConnectOptions::dev_user(url, "bob")).await.unwrap();
        let reply = conn.publish("news:1", &json!({ "a": 1 }), Some("k1")).await.unwrap();
        assert_eq!(reply.kind, "error");
        assert_eq!(reply.code, Some(json!("forbidden")));
        let err = conn
            .request_ok(json!({ "type": "publish", "channel": "news:1", "data": 1, "idempotency_key": "k1" }))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some("forbidden"));
        assert_eq!(err.error_code(), Some(herald_proto::ErrorCode::Forbidden));
        drop(script.await.unwrap());
    })
    .await;
}

#[tokio::test]
async fn server_close_is_reported_with_its_code_after_the_disconnect_frame() {
    within(async {
        let server = FakeServer::start().await;
        let url = server.url();
        let script = tokio::spawn(async move {
            let c = server.accept().await;
            c.disconnect(4008, "slow consumer", true).await;
        });
        let mut conn = Connection::connect(&ConnectOptions::dev_user(url, "a")).await.unwrap();
        let d = conn.next_frame().await.unwrap().unwrap().into_frame().unwrap();
        assert_eq!(d.kind, "disconnect");
        assert_eq!((d.code, d.reconnect), (Some(json!(4008)), Some(true)));
        match conn.next_frame().await.unwrap() {
            Some(ServerEvent::Closed { code, reason }) => {
                assert_eq!(code, Some(4008));
                assert_eq!(reason, "slow consumer");
            }
            other => panic!("{other:?}"),
        }
        assert!(conn.next_frame().await.unwrap().is_none());
        // The server saw our close acknowledgement (its close() returned).
        script.await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_request_interrupted_by_close_fails_and_the_close_stays_visible() {
    within(async {
        let server = FakeServer::start().await;
        let url = server.url();
        let script = tokio::spawn(async move {
            let mut c = server.accept().await;
            c.recv_type("ping").await;
            c.send(msg("chat:1", 1)).await;
            c.close(1001, "going away").await;
        });
        let mut conn = Connection::connect(&ConnectOptions::dev_user(url, "a")).await.unwrap();
        let err = conn.ping().await.unwrap_err();
        assert_eq!(err.close_code(), Some(1001));
        let m = conn.next_frame().await.unwrap().unwrap();
        assert_eq!(m.frame().unwrap().seq, Some(1));
        assert!(matches!(
            conn.next_frame().await.unwrap(),
            Some(ServerEvent::Closed { code: Some(1001), .. })
        ));
        script.await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn auth_and_device_go_where_the_options_say() {
    within(async {
        let server = FakeServer::start().await;
        let url = server.url();
        let script = tokio::spawn(async move {
            let c = server.accept().await;
            assert_eq!(c.request.uri().path(), "/ws");
            assert_eq!(c.header("authorization"), Some("Bearer t.o.k"));
            assert_eq!(c.query(), "device=phone%201");
            let c = server.accept().await;
            assert_eq!(c.header("authorization"), None);
            assert_eq!(c.query(), "token=t.o.k");
            let c = server.accept().await;
            assert_eq!(c.query(), "user=alice");
        });
        let opts = ConnectOptions::token(url.clone(), "t.o.k").with_device("phone 1");
        let _a = Connection::connect(&opts).await.unwrap();
        let opts = ConnectOptions::token(url.clone(), "t.o.k").with_token_in_query(true);
        let _b = Connection::connect(&opts).await.unwrap();
        // The caller may bring its own connected socket (a chosen source
        // address, say).
        let stream = tokio::net::TcpStream::connect(url.trim_start_matches("http://")).await.unwrap();
        let _c = Connection::connect_on(&ConnectOptions::dev_user(url, "alice"), stream).await.unwrap();
        script.await.unwrap();
    })
    .await;
}

#[test]
fn tokens_never_show_in_debug_output() {
    let opts = ConnectOptions::token("http://h", "secret-jwt");
    assert!(!format!("{opts:?}").contains("secret-jwt"));
    assert_eq!(format!("{:?}", Auth::DevUser("a".into())), "DevUser(\"a\")");
}

/// Serve one raw HTTP response to the next connection and return the
/// request head it answered.
async fn serve_raw_once(server: FakeServer, response: Vec<u8>) -> String {
    let mut s = server.accept_raw().await;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0);
        buf.extend_from_slice(&chunk[..n]);
    }
    s.write_all(&response).await.unwrap();
    // Keep the connection open: the client must not need EOF to finish.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    String::from_utf8(buf).unwrap()
}

#[tokio::test]
async fn refused_upgrade_carries_status_and_problem_code() {
    within(async {
        let server = FakeServer::start().await;
        let url = server.url();
        let body = r#"{"type":"urn:herald:error:unauthorized","title":"Unauthorized","status":401,"code":"unauthorized","detail":"no token"}"#;
        let response = format!(
            "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/problem+json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let script = tokio::spawn(serve_raw_once(server, response.into_bytes()));
        let err = Connection::connect(&ConnectOptions::new(url, Auth::None)).await.unwrap_err();
        match &err {
            ClientError::Rejected { status: 401, code: Some(code), problem: Some(p), .. } => {
                assert_eq!(code, "unauthorized");
                assert_eq!(p.detail, "no token");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(err.http_status(), Some(401));
        let head = script.await.unwrap();
        assert!(head.starts_with("GET /ws HTTP/1.1\r\n"), "{head}");
    })
    .await;
}

#[tokio::test]
async fn refused_upgrade_with_a_chunked_body_still_yields_the_code() {
    within(async {
        let server = FakeServer::start().await;
        let url = server.url();
        let body = r#"{"code":"forbidden","status":403}"#;
        let (a, b) = body.split_at(10);
        let response = format!(
            "HTTP/1.1 403 Forbidden\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
            a.len(),
            b.len()
        );
        let script = tokio::spawn(serve_raw_once(server, response.into_bytes()));
        let err = Connection::connect(&ConnectOptions::dev_user(url, "x")).await.unwrap_err();
        assert_eq!((err.http_status(), err.code()), (Some(403), Some("forbidden")), "{err:?}");
        script.await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn bytes_sent_right_after_the_101_are_not_lost() {
    within(async {
        let server = FakeServer::start().await;
        let url = server.url();
        let script = tokio::spawn(async move {
            let mut s = server.accept_raw().await;
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1024];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut chunk).await.unwrap();
                buf.extend_from_slice(&chunk[..n]);
            }
            let head = String::from_utf8(buf).unwrap();
            let key = head
                .lines()
                .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
                .expect("key header")
                .trim()
                .to_owned();
            let payload = br#"{"type":"pong","req":7}"#;
            let mut out = format!(
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n\r\n",
                expected_accept(&key)
            )
            .into_bytes();
            // An unmasked text frame in the same write as the head.
            out.push(0x81);
            out.push(payload.len() as u8);
            out.extend_from_slice(payload);
            s.write_all(&out).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        });
        let mut conn = Connection::connect(&ConnectOptions::dev_user(url, "x")).await.unwrap();
        let f = conn.next_frame().await.unwrap().unwrap().into_frame().unwrap();
        assert_eq!((f.kind.as_str(), f.req), ("pong", Some(7)));
        script.await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_wrong_accept_header_fails_the_handshake() {
    within(async {
        let server = FakeServer::start().await;
        let url = server.url();
        let response = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: bogus\r\n\r\n".to_vec();
        let script = tokio::spawn(serve_raw_once(server, response));
        let err = Connection::connect(&ConnectOptions::dev_user(url, "x")).await.unwrap_err();
        assert!(matches!(err, ClientError::Handshake(_)), "{err:?}");
        script.await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn connect_to_a_closed_port_is_a_connect_error() {
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let err =
        Connection::connect(&ConnectOptions::dev_user(format!("http://{addr}"), "x")).await.unwrap_err();
    assert!(matches!(err, ClientError::Connect { .. }), "{err:?}");
}
