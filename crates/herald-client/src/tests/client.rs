use std::time::Duration;

use serde_json::json;

use super::{msg, sub_ok, within, FakeServer};
use crate::{Backoff, Client, ClientError, ClientOptions, ConnState, ConnectOptions, Event};

fn fast_opts(url: String) -> ClientOptions {
    ClientOptions {
        backoff: Backoff::new(Duration::from_millis(5), Duration::from_millis(20)),
        request_timeout: Duration::from_secs(5),
        ..ClientOptions::new(ConnectOptions::dev_user(url, "alice"))
    }
}

fn seq_of(ev: &Event) -> Option<u64> {
    match ev {
        Event::Message(d) => d.seq,
        _ => None,
    }
}

#[tokio::test]
async fn resumes_with_since_after_a_slow_consumer_close_and_drops_duplicates() {
    within(async {
        let server = FakeServer::start().await;
        let client = Client::new(fast_opts(server.url()));
        let script = tokio::spawn(async move {
            let mut c = server.accept().await;
            let s = c.recv_type("subscribe").await;
            assert_eq!(s["channel"], "chat:1");
            assert!(s.get("since").is_none(), "fresh subscribe has no since: {s}");
            let client_id = s["client_id"].as_str().expect("a presence member id").to_owned();
            c.send(sub_ok(&s["req"], "chat:1", "E", 1, 2)).await;
            c.send(msg("chat:1", 3)).await;
            c.send(msg("chat:1", 4)).await;
            c.disconnect(4008, "slow consumer", true).await;

            let mut c = server.accept().await;
            let s = c.recv_type("subscribe").await;
            assert_eq!(s["since"], json!({ "seq": 4, "epoch": "E" }), "resume from the last delivered seq");
            assert_eq!(s["client_id"], client_id, "the same member id across reconnects");
            c.send(sub_ok(&s["req"], "chat:1", "E", 1, 5)).await;
            // A duplicate at the seam must not reach the caller.
            c.send(msg("chat:1", 4)).await;
            c.send(msg("chat:1", 5)).await;
            c
        });

        let mut sub = client.subscribe("chat:1", None).await.unwrap();
        assert_eq!(sub.info().head, Some(2));
        assert_eq!(sub.info().epoch.as_deref(), Some("E"));
        let mut seqs = Vec::new();
        for _ in 0..3 {
            let d = sub.next_message().await.unwrap().unwrap();
            assert_eq!(d.json::<serde_json::Value>().unwrap(), json!({ "n": d.seq }));
            assert_eq!(d.channel.as_str(), "chat:1");
            seqs.push(d.seq.unwrap());
        }
        assert_eq!(seqs, [3, 4, 5]);
        assert_eq!(client.status().connects, 2);
        assert_eq!(client.status().state, ConnState::Connected);
        drop(script.await.unwrap());
    })
    .await;
}

#[tokio::test]
async fn resume_with_nothing_delivered_starts_from_the_head_seen_at_subscribe() {
    within(async {
        let server = FakeServer::start().await;
        let client = Client::new(fast_opts(server.url()));
        let script = tokio::spawn(async move {
            let mut c = server.accept().await;
            let s = c.recv_type("subscribe").await;
            c.send(sub_ok(&s["req"], "chat:1", "E", 1, 7)).await;
            c.close(1001, "going away").await;
            let mut c = server.accept().await;
            let s = c.recv_type("subscribe").await;
            // Messages 8.. published while we were away must come back.
            assert_eq!(s["since"], json!({ "seq": 7, "epoch": "E" }));
            c.send(sub_ok(&s["req"], "chat:1", "E", 1, 8)).await;
            c.send(msg("chat:1", 8)).await;
            c
        });
        let mut sub = client.subscribe("chat:1", None).await.unwrap();
        assert_eq!(sub.next_message().await.unwrap().unwrap().seq, Some(8));
        drop(script.await.unwrap());
    })
    .await;
}

#[tokio::test]
async fn truncation_on_resume_is_reported_before_the_messages() {
    within(async {
        let server = FakeServer::start().await;
        let client = Client::new(fast_opts(server.url()));
        let script = tokio::spawn(async move {
            let mut c = server.accept().await;
            let s = c.recv_type("subscribe").await;
            assert_eq!(s["since"], json!({ "seq": 2, "epoch": "E" }), "caller's since is sent");
            c.send(sub_ok(&s["req"], "chat:1", "E", 1, 3)).await;
            c.send(msg("chat:1", 3)).await;
            c.close(1001, "going away").await;

            let mut c = server.accept().await;
            let s = c.recv_type("subscribe").await;
            assert_eq!(s["since"]["seq"], 3);
            let mut ok = sub_ok(&s["req"], "chat:1", "E", 10, 11);
            ok["truncated"] = json!(true);
            c.send(ok).await;
            c.send(msg("chat:1", 10)).await;
            c.send(msg("chat:1", 11)).await;
            c
        });
        let mut sub = client.subscribe("chat:1", Some((2, "E".into()))).await.unwrap();
        assert_eq!(seq_of(&sub.next().await.unwrap().unwrap()), Some(3));
        match sub.next().await.unwrap().unwrap() {
            Event::Reset { truncated: true, epoch_changed: false, first: 10, head: 11, epoch, channel } => {
                assert_eq!((epoch.as_str(), channel.as_str()), ("E", "chat:1"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(seq_of(&sub.next().await.unwrap().unwrap()), Some(10));
        assert_eq!(seq_of(&sub.next().await.unwrap().unwrap()), Some(11));
        drop(script.await.unwrap());
    })
    .await;
}

#[tokio::test]
async fn epoch_change_on_the_initial_subscribe_is_an_event_and_seqs_restart() {
    within(async {
        let server = FakeServer::start().await;
        let client = Client::new(fast_opts(server.url()));
        let script = tokio::spawn(async move {
            let mut c = server.accept().await;
            let s = c.recv_type("subscribe").await;
            assert_eq!(s["since"], json!({ "seq": 40, "epoch": "OLD" }));
            let mut ok = sub_ok(&s["req"], "chat:1", "NEW", 1, 2);
            ok["epoch_changed"] = json!(true);
            c.send(ok).await;
            c.send(msg("chat:1", 1)).await;
            c.send(msg("chat:1", 2)).await;
            c
        });
        let mut sub = client.subscribe("chat:1", Some((40, "OLD".into()))).await.unwrap();
        assert!(sub.info().epoch_changed);
        assert!(matches!(
            sub.next().await.unwrap().unwrap(),
            Event::Reset { epoch_changed: true, first: 1, .. }
        ));
        assert_eq!(seq_of(&sub.next().await.unwrap().unwrap()), Some(1));
        assert_eq!(seq_of(&sub.next().await.unwrap().unwrap()), Some(2));
        drop(script.await.unwrap());
    })
    .await;
}

#[tokio::test]
async fn a_gap_is_reported_not_hidden() {
    within(async {
        let server = FakeServer::start().await;
        let client = Client::new(fast_opts(server.url()));
        let script = tokio::spawn(async move {
            let mut c = server.accept().await;
            let s = c.recv_type("subscribe").await;
            c.send(sub_ok(&s["req"], "chat:1", "E", 1, 0)).await;
            c.send(msg("chat:1", 1)).await;
            c.send(msg("chat:1", 4)).await;
            c
        });
        let mut sub = client.subscribe("chat:1", None).await.unwrap();
        assert_eq!(seq_of(&sub.next().await.unwrap().unwrap()), Some(1));
        assert!(matches!(sub.next().await.unwrap().unwrap(), Event::Gap { expected: 2, got: 4, .. }));
        assert_eq!(seq_of(&sub.next().await.unwrap().unwrap()), Some(4));
        drop(script.await.unwrap());
    })
    .await;
}

#[tokio::test]
async fn disconnect_without_reconnect_ends_everything_with_the_reason() {
    within(async {
        let server = FakeServer::start().await;
        let client = Client::new(fast_opts(server.url()));
        let script = tokio::spawn(async move {
            let mut c = server.accept().await;
            let s = c.recv_type("subscribe").await;
            c.send(sub_ok(&s["req"], "user:alice", "E", 1, 0)).await;
            c.disconnect(4001, "unauthorized", false).await;
        });
        let mut sub = client.subscribe("user:alice", None).await.unwrap();
        let err = sub.next().await.unwrap().unwrap_err();
        assert!(matches!(err, ClientError::Disconnected { code: 4001, .. }), "{err:?}");
        assert!(sub.next().await.is_none());
        let mut status = client.watch_status();
        status.wait_for(|s| s.state == ConnState::Closed).await.unwrap();
        let err = client.publish("chat:1", &json!(1), None).await.unwrap_err();
        assert_eq!(err.close_code(), Some(4001));
        script.await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_refused_subscribe_returns_the_server_code() {
    within(async {
        let server = FakeServer::start().await;
        let client = Client::new(fast_opts(server.url()));
        let script = tokio::spawn(async move {
            let mut c = server.accept().await;
            let s = c.recv_type("subscribe").await;
            c.send(json!({
                "type": "error", "req": s["req"], "code": "forbidden",
                "message": "the token does not allow this channel", "channel": "secret:1",
            }))
            .await;
            c
        });
        let err = client.subscribe("secret:1", None).await.unwrap_err();
        assert_eq!(err.code(), Some("forbidden"));
        let err = client.subscribe("bad channel", None).await.unwrap_err();
        assert!(matches!(err, ClientError::Config(_)));
        drop(script.await.unwrap());
    })
    .await;
}

#[tokio::test]
async fn publish_over_the_socket_and_connection_loss_in_flight() {
    within(async {
        let server = FakeServer::start().await;
        let client = Client::new(fast_opts(server.url()));
        let script = tokio::spawn(async move {
            let mut c = server.accept().await;
            let p = c.recv_type("publish").await;
            assert_eq!(p["data"], json!({ "text": "hi" }));
            assert_eq!(p["idempotency_key"], "k1");
            assert!(p.get("meta").is_none());
            c.send(json!({
                "type": "ok", "req": p["req"], "channel": "chat:1",
                "seq": 8, "id": "m8", "duplicate": false,
            }))
            .await;
            // Drop the connection with the second publish unanswered.
            c.recv_type("publish").await;
            drop(c);
            let mut c = server.accept().await;
            let p = c.recv_type("publish").await;
            c.send(json!({
                "type": "ok", "req": p["req"], "channel": "chat:1",
                "seq": 9, "id": "m9", "duplicate": true,
            }))
            .await;
            c
        });
        let r = client.publish("chat:1", &json!({ "text": "hi" }), Some("k1")).await.unwrap();
        assert_eq!((r.seq, r.id.as_str(), r.duplicate), (Some(8), "m8", false));
        let err = client.publish("chat:1", &json!(2), Some("k2")).await.unwrap_err();
        assert!(matches!(err, ClientError::ConnectionLost), "{err:?}");
        // The caller retries with the same key once reconnected.
        let r = client.publish("chat:1", &json!(2), Some("k2")).await.unwrap();
        assert_eq!((r.seq, r.duplicate), (Some(9), true));
        drop(script.await.unwrap());
    })
    .await;
}

#[tokio::test]
async fn a_refused_connection_is_final() {
    within(async {
        let server = FakeServer::start().await;
        let client = Client::new(fast_opts(server.url()));
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = server.accept_raw().await;
            let mut buf = [0u8; 2048];
            let _ = s.read(&mut buf).await;
            let body = r#"{"code":"unauthorized"}"#;
            let resp = format!("HTTP/1.1 401 Unauthorized\r\ncontent-length: {}\r\n\r\n{body}", body.len());
            s.write_all(resp.as_bytes()).await.unwrap();
            // Any further attempt would hang here: the test would time out.
            let _ = server.accept_raw().await;
            panic!("the client reconnected after a 401");
        });
        let err = client.subscribe("chat:1", None).await.unwrap_err();
        assert_eq!((err.http_status(), err.code()), (Some(401), Some("unauthorized")), "{err:?}");
    })
    .await;
}

#[tokio::test]
async fn gives_up_after_the_configured_number_of_attempts() {
    within(async {
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let opts = ClientOptions { max_reconnect_attempts: Some(3), ..fast_opts(format!("http://{addr}")) };
        let client = Client::new(opts);
        let err = client.subscribe("chat:1", None).await.unwrap_err();
        match err {
            ClientError::ReconnectExhausted { attempts: 3, last } => {
                assert!(matches!(*last, ClientError::Connect { .. }), "{last:?}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(client.status().state, ConnState::Closed);
    })
    .await;
}

#[tokio::test]
async fn a_silent_connection_is_probed_and_replaced() {
    within(async {
        let server = FakeServer::start().await;
        let opts = ClientOptions {
            ping_interval: Duration::from_millis(100),
            pong_timeout: Duration::from_millis(100),
            ..fast_opts(server.url())
        };
        let client = Client::new(opts);
        let script = tokio::spawn(async move {
            let mut c = server.accept().await;
            let s = c.recv_type("subscribe").await;
            c.send(sub_ok(&s["req"], "chat:1", "E", 1, 0)).await;
            // Stop reading: our library then never answers the client's
            // ping, like a half-open connection.
            let mut c2 = server.accept().await;
            let s = c2.recv_type("subscribe").await;
            assert_eq!(s["since"]["seq"], 0);
            c2.send(sub_ok(&s["req"], "chat:1", "E", 1, 1)).await;
            c2.send(msg("chat:1", 1)).await;
            (c, c2)
        });
        let mut sub = client.subscribe("chat:1", None).await.unwrap();
        assert_eq!(sub.next_message().await.unwrap().unwrap().seq, Some(1));
        assert_eq!(client.status().connects, 2);
        drop(script.await.unwrap());
    })
    .await;
}

#[tokio::test]
async fn an_answered_ping_keeps_the_connection() {
    within(async {
        let server = FakeServer::start().await;
        let opts = ClientOptions {
            ping_interval: Duration::from_millis(50),
            pong_timeout: Duration::from_millis(200),
            ..fast_opts(server.url())
        };
        let client = Client::new(opts);
        let script = tokio::spawn(async move {
            let mut c = server.accept().await;
            let s = c.recv_type("subscribe").await;
            c.send(sub_ok(&s["req"], "chat:1", "E", 1, 0)).await;
            // Reading answers the client's pings; no text frame arrives, so
            // this returns only when the client closes.
            let end = tokio::time::timeout(Duration::from_millis(600), c.try_recv()).await;
            assert!(end.is_err(), "client sent a frame or closed: {end:?}");
            c
        });
        let _sub = client.subscribe("chat:1", None).await.unwrap();
        let c = script.await.unwrap();
        assert_eq!(client.status().connects, 1);
        drop(c);
    })
    .await;
}

#[tokio::test]
async fn dropping_a_subscription_unsubscribes_and_close_ends_the_rest() {
    within(async {
        let server = FakeServer::start().await;
        let client = Client::new(fast_opts(server.url()));
        let script = tokio::spawn(async move {
            let mut c = server.accept().await;
            for ch in ["a:1", "b:1"] {
                let s = c.recv_type("subscribe").await;
                assert_eq!(s["channel"], ch);
                c.send(sub_ok(&s["req"], ch, "E", 1, 0)).await;
            }
            let u = c.recv_type("unsubscribe").await;
            assert_eq!(u["channel"], "a:1");
            c.send(json!({ "type": "ok", "req": u["req"], "channel": "a:1" })).await;
            // Then the client closes normally.
            assert!(c.try_recv().await.is_none());
        });
        let a = client.subscribe("a:1", None).await.unwrap();
        let mut b = client.subscribe("b:1", None).await.unwrap();
        let err = client.subscribe("b:1", None).await.unwrap_err();
        assert!(matches!(err, ClientError::AlreadySubscribed(_)));
        drop(a);
        tokio::time::sleep(Duration::from_millis(50)).await;
        client.close().await;
        assert!(b.next().await.is_none(), "a closed client ends subscriptions without an error");
        script.await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn subscribing_while_the_server_is_down_waits_for_it() {
    within(async {
        // Reserve a port, start the server on it a bit later.
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let client = Client::new(fast_opts(format!("http://{addr}")));
        let script = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
            let (stream, _) = listener.accept().await.unwrap();
            let (_, ws) = tokio_websockets::ServerBuilder::new().accept(stream).await.unwrap();
            let mut c = super::FakeConn { request: http::Request::new(()), ws };
            let s = c.recv_type("subscribe").await;
            c.send(sub_ok(&s["req"], "chat:1", "E", 1, 3)).await;
            c
        });
        let sub = client.subscribe("chat:1", None).await.unwrap();
        assert_eq!(sub.info().head, Some(3));
        drop(script.await.unwrap());
    })
    .await;
}

#[tokio::test]
async fn volatile_messages_pass_through_without_seq() {
    within(async {
        let server = FakeServer::start().await;
        let client = Client::new(fast_opts(server.url()));
        let script = tokio::spawn(async move {
            let mut c = server.accept().await;
            let s = c.recv_type("subscribe").await;
            c.send(json!({ "type": "ok", "req": s["req"], "channel": "typing:1" })).await;
            for i in 0..2 {
                c.send(json!({
                    "type": "message", "channel": "typing:1", "id": format!("v{i}"),
                    "ts": 1, "data": { "i": i }, "meta": { "trace_id": "t" },
                }))
                .await;
            }
            c
        });
        let mut sub = client.subscribe("typing:1", None).await.unwrap();
        assert_eq!(sub.info().epoch, None);
        for i in 0..2 {
            let d = sub.next_message().await.unwrap().unwrap();
            assert_eq!((d.seq, d.id.clone()), (None, format!("v{i}")));
            assert_eq!(d.meta.unwrap()["trace_id"], "t");
        }
        drop(script.await.unwrap());
    })
    .await;
}

#[tokio::test]
async fn close_completes_while_a_subscription_is_full_and_unread() {
    within(async {
        let server = FakeServer::start().await;
        let opts = ClientOptions { event_capacity: 2, ..fast_opts(server.url()) };
        let client = Client::new(opts);
        let script = tokio::spawn(async move {
            let mut c = server.accept().await;
            let s = c.recv_type("subscribe").await;
            c.send(sub_ok(&s["req"], "chat:1", "E", 1, 0)).await;
            for seq in 1..=10 {
                c.send(msg("chat:1", seq)).await;
            }
            assert!(c.try_recv().await.is_none(), "the client closes");
        });
        let mut sub = client.subscribe("chat:1", None).await.unwrap();
        // Let the worker fill the queue and block on it.
        tokio::time::sleep(Duration::from_millis(100)).await;
        client.close().await;
        assert_eq!(client.status().state, ConnState::Closed);
        // What was queued is still readable, in order, then the end.
        assert_eq!(seq_of(&sub.next().await.unwrap().unwrap()), Some(1));
        assert_eq!(seq_of(&sub.next().await.unwrap().unwrap()), Some(2));
        assert!(sub.next().await.is_none());
        script.await.unwrap();
    })
    .await;
}
