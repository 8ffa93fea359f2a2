//! Per-connection limits: the frame budget and the 4009 close, the cap on
//! error replies, outbox bytes per connection and server-wide, token expiry.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use herald_client::{ConnectOptions, Connection, ServerEvent};
use herald_server::Config;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::json;

use herald_test_support::*;

/// A metric's value from `/metrics` text (`name` with its labels, if any).
fn metric(srv: &TestServer, name: &str) -> i64 {
    let text = srv.state.metrics.render();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .map_or(0, |v| v.trim().parse::<f64>().expect("a number") as i64)
}

/// What came back while flooding.
#[derive(Debug, Default)]
struct Flood {
    /// `error` replies by code.
    errors: Vec<String>,
    other: usize,
    /// The server's close code, if it closed.
    closed: Option<Option<u16>>,
    disconnect_reconnect: Option<bool>,
    /// From the first frame sent to the close (or to the end of the flood).
    elapsed: Duration,
}

impl Flood {
    fn count(&self, code: &str) -> usize {
        self.errors.iter().filter(|c| *c == code).count()
    }
}

/// Send `frame` `per_tick` times every `tick`, for at most `max`, reading
/// whatever comes back in between; stop at the server's close.
async fn flood(c: &mut Connection, frame: &str, per_tick: usize, tick: Duration, max: Duration) -> Flood {
    let mut out = Flood::default();
    let start = tokio::time::Instant::now();
    let mut next_tick = start;
    let mut sending = true;
    while start.elapsed() < max {
        if sending {
            for _ in 0..per_tick {
                if c.send_raw(frame).await.is_err() {
                    // The server closed meanwhile; read what it said.
                    sending = false;
                    break;
                }
            }
        }
        next_tick += tick;
        loop {
            let wait =
                if sending { next_tick.saturating_duration_since(tokio::time::Instant::now()) } else { WAIT };
            match tokio::time::timeout(wait, c.next_frame()).await {
                Err(_) => break, // time for the next burst
                Ok(Ok(Some(ServerEvent::Frame(f)))) => match f.kind.as_str() {
                    "error" => out
                        .errors
                        .push(f.code.and_then(|c| c.as_str().map(str::to_owned)).unwrap_or_default()),
                    "disconnect" => out.disconnect_reconnect = f.reconnect,
                    _ => out.other += 1,
                },
                Ok(Ok(Some(ServerEvent::Closed { code, .. }))) => {
                    out.closed = Some(code);
                    out.elapsed = start.elapsed();
                    return out;
                }
                Ok(Ok(None)) | Ok(Err(_)) => {
                    out.closed = Some(None);
                    out.elapsed = start.elapsed();
                    return out;
                }
            }
        }
    }
    out.elapsed = start.elapsed();
    out
}

fn strict_budget(c: &mut Config) {
    c.rate_limits.client_frames_per_sec = 20;
    c.rate_limits.close_window = Duration::from_secs(2);
    c.rate_limits.close_percent = 50; // close past 20 refusals in 2 s
}

#[tokio::test]
async fn a_sustained_flood_is_closed_with_4009_within_the_window() {
    let srv = TestServer::start_with(strict_budget).await;
    let mut c = srv.connect("flooder").await;
    // 8x the budget (160 frames a second) for up to 10 s: refills between
    // bursts must not reset anything.
    let f =
        flood(&mut c, r#"{"type":"ping","req":1}"#, 8, Duration::from_millis(50), Duration::from_secs(10))
            .await;
    assert_eq!(f.closed, Some(Some(4009)), "{f:?}");
    assert_eq!(f.disconnect_reconnect, Some(true), "a disconnect frame says why, and to come back");
    assert!(f.elapsed < Duration::from_secs(4), "closed within the window (2 s) and a margin: {f:?}");
    // Closed at the 21st refusal of the window.
    assert!(f.count("rate_limited") <= 21, "{f:?}");
    assert!(metric(&srv, "herald_frames_refused_total") >= 21);
    assert_eq!(metric(&srv, r#"herald_closes_total{reason="rate_limited"}"#), 1);
}

#[tokio::test]
async fn error_replies_are_capped_and_the_rest_counted() {
    let srv = TestServer::start_with(|c| {
        c.rate_limits.client_frames_per_sec = 20;
        c.rate_limits.close_percent = 100; // 200 refusals in 10 s
        c.rate_limits.error_replies_per_sec = 5;
    })
    .await;
    let mut c = srv.connect("noisy").await;
    // 20 accepted bad frames (bad_json each) and 130 refused ones
    // (rate_limited each): 150 errors, at most 5 a second sent.
    let f = flood(&mut c, "{nope", 150, Duration::from_millis(1500), Duration::from_millis(1500)).await;
    assert_eq!(f.closed, None, "under the close threshold: {f:?}");
    let allowed = 5 + (f.elapsed.as_secs_f64() * 5.0).ceil() as usize;
    assert!(
        f.errors.len() <= allowed,
        "{} error replies in {:?}, at most {allowed}",
        f.errors.len(),
        f.elapsed
    );
    assert!(f.count("bad_json") >= 1, "{f:?}");
    let dropped = metric(&srv, "herald_error_replies_dropped_total");
    assert_eq!(dropped as usize, 150 - f.errors.len(), "every error not sent is counted");
    // The connection still works once the budgets refill (a refused ping
    // may get no reply: retry).
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        assert!(tokio::time::Instant::now() < deadline, "no pong after the flood");
        match tokio::time::timeout(Duration::from_secs(1), c.ping()).await {
            Ok(reply) if reply.as_ref().unwrap().kind == "pong" => break,
            Ok(reply) => assert_eq!(reply.unwrap().code, Some(json!("rate_limited"))),
            Err(_) => {}
        }
    }
}

#[tokio::test]
async fn an_invalid_ack_flood_is_closed_with_4009() {
    let srv = TestServer::start_with(strict_budget).await;
    let mut c = srv.connect("acker").await;
    assert_eq!(c.subscribe("user:acker", None).await.unwrap().kind, "ok");
    // Seq 999 was never delivered: each ack is invalid and costs budget.
    let ack = r#"{"type":"ack","channel":"user:acker","seq":999}"#;
    let f = flood(&mut c, ack, 8, Duration::from_millis(50), Duration::from_secs(10)).await;
    assert_eq!(f.closed, Some(Some(4009)), "{f:?}");
    let budget = 20 + (f.elapsed.as_secs_f64() * 20.0).ceil() as usize;
    assert!(f.count("bad_request") <= budget, "at most the budget's worth of invalid acks answered: {f:?}");
    // Acks on a channel not subscribed count as well.
    let mut d = srv.connect("acker2").await;
    let ack = r#"{"type":"ack","channel":"user:nope","seq":1}"#;
    let f = flood(&mut d, ack, 8, Duration::from_millis(50), Duration::from_secs(10)).await;
    assert_eq!(f.closed, Some(Some(4009)), "{f:?}");
}

#[tokio::test]
async fn a_client_acking_every_message_at_full_speed_is_never_closed() {
    // A budget of 10 frames a second and a close at the first refusal in a
    // window: the acks of 600 messages must not touch it.
    let srv = TestServer::start_with(|c| {
        c.rate_limits.client_frames_per_sec = 10;
        c.rate_limits.close_window = Duration::from_secs(1);
        c.rate_limits.close_percent = 10;
    })
    .await;
    for i in 1..=600 {
        assert_eq!(srv.publish("user:fast", json!(i)).await.status, 201);
    }
    let mut c = srv.connect("fast").await;
    c.subscribe("user:fast", None).await.unwrap();
    for seq in 1..=600u64 {
        let m = next_frame(&mut c).await;
        assert_eq!((m.kind.as_str(), m.seq), ("message", Some(seq)));
        c.send(&json!({ "type": "ack", "channel": "user:fast", "seq": seq })).await.unwrap();
    }
    assert_eq!(c.ping().await.unwrap().kind, "pong");
    assert_eq!(metric(&srv, "herald_frames_refused_total"), 0);
    assert_eq!(metric(&srv, r#"herald_closes_total{reason="rate_limited"}"#), 0);
}

/// A client that subscribes and then never reads: a small receive buffer,
/// so the server's writes block soon.
async fn stuck_client(srv: &TestServer, user: &str, channel: &str) -> (Connection, String) {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let stream = sock.connect(srv.addr).await.unwrap();
    let mut c = Connection::connect_on(&ConnectOptions::dev_user(&srv.url, user), stream).await.unwrap();
    let ok = c.subscribe(channel, None).await.unwrap();
    assert_eq!(ok.kind, "ok");
    (c, ok.epoch.unwrap())
}

/// About 60 KB of `data`: large enough that a few frames fill an outbox's
/// byte bound.
fn big(i: u64) -> serde_json::Value {
    json!({ "i": i, "blob": "x".repeat(60_000) })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_over_its_byte_bound_is_kicked_and_resumes() {
    // 4 MiB would take ~70 messages; the frame bound (1024) is far away.
    let srv = TestServer::start_with(|c| c.websocket.outbox_bytes = 512 * 1024).await;
    let (mut stuck, epoch) = stuck_client(&srv, "stuck", "chat:bytes").await;
    let mut published = 0u64;
    while metric(&srv, "herald_slow_consumer_disconnects_total") == 0 {
        assert!(published < 2000, "never kicked after {published} messages of 60 KB");
        published += 1;
        assert_eq!(srv.publish("chat:bytes", big(published)).await.status, 201);
    }
    assert!(metric(&srv, r#"herald_outbox_full_total{limit="bytes"}"#) >= 1);
    assert_eq!(metric(&srv, r#"herald_outbox_full_total{limit="frames"}"#), 0);
    let (frames, code) = read_until_closed(&mut stuck).await;
    assert_eq!(code, Some(4008));
    assert!(frames.iter().any(|f| f.kind == "disconnect" && f.reconnect == Some(true)));
    let got: Vec<u64> = frames.iter().filter(|f| f.kind == "message").map(|f| f.seq.unwrap()).collect();
    assert_eq!(got, (1..=got.len() as u64).collect::<Vec<_>>(), "in order, gap-free");
    // It resumes from the log: exactly the rest.
    let mut again = srv.connect("stuck").await;
    let last = got.len() as u64;
    again.subscribe("chat:bytes", Some((last, &epoch))).await.unwrap();
    let rest = next_messages(&mut again, (published - last) as usize).await;
    assert_eq!(seqs(&rest), (last + 1..=published).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_wide_ceiling_holds_and_a_reader_loses_nothing() {
    const CEILING: usize = 1024 * 1024;
    let srv = TestServer::start_with(|c| {
        c.websocket.outbox_bytes = 512 * 1024;
        c.websocket.total_outbox_bytes = CEILING;
    })
    .await;
    // Watch the gauge while everything runs.
    let peak = Arc::new(AtomicI64::new(0));
    let sampler = {
        let (state, peak) = (srv.state.clone(), peak.clone());
        tokio::spawn(async move {
            loop {
                peak.fetch_max(state.metrics.outbox_bytes.get(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        })
    };
    // Four stuck connections on four channels (their messages add up: no
    // sharing), together able to hold twice the ceiling.
    let channels = ["chat:c0", "chat:c1", "chat:c2", "chat:c3"];
    let mut stuck = Vec::new();
    for (i, ch) in channels.iter().enumerate() {
        stuck.push(stuck_client(&srv, &format!("stuck{i}"), ch).await.0);
    }
    // And one client that reads everything, on every channel.
    let mut reader = srv.connect("reader").await;
    for ch in channels {
        reader.subscribe(ch, None).await.unwrap();
    }
    let reader = tokio::spawn(async move {
        let mut next = [1u64; 4];
        let mut got = 0;
        while got < 4 * 60 {
            let m = next_frame(&mut reader).await;
            assert_eq!(m.kind, "message", "the reader is never kicked: {m:?}");
            let i = m.channel.as_deref().unwrap().strip_prefix("chat:c").unwrap().parse::<usize>().unwrap();
            assert_eq!(m.seq, Some(next[i]), "in order, gap-free, once");
            next[i] += 1;
            got += 1;
        }
    });
    for n in 1..=60 {
        for ch in channels {
            assert_eq!(srv.publish(ch, big(n)).await.status, 201);
        }
    }
    tokio::time::timeout(WAIT, reader).await.expect("the reader gets every message").unwrap();
    assert!(metric(&srv, r#"herald_outbox_full_total{limit="server"}"#) >= 1, "the ceiling was reached");
    assert!(metric(&srv, "herald_outbox_shed_total") >= 1, "the largest holders were shed");
    // Shed stuck connections were closed with 4008 (their close frames may
    // be cut short: they never read, and the server stops waiting for them
    // after 2 s); shedding stops under three quarters of the ceiling, so
    // some may remain, holding what they hold.
    let kicked = metric(&srv, r#"herald_closes_total{reason="slow_consumer"}"#);
    assert!((1..=4).contains(&kicked), "{kicked} closed with 4008");
    drop(stuck);
    sampler.abort();
    let peak = peak.load(Ordering::Relaxed);
    assert!(peak > 0 && peak as usize <= CEILING, "queued bytes peaked at {peak}, ceiling {CEILING}");
}

#[tokio::test]
async fn an_expiring_token_closes_at_exp_not_at_the_next_ping() {
    let srv = TestServer::start_with(|c| {
        c.heartbeat.ping_interval = Duration::from_secs(60);
        c.heartbeat.idle_timeout = Duration::from_secs(120);
        c.jwt.leeway_secs = 1;
        c.dev = false;
    })
    .await;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let exp = now + 2;
    let token = encode(
        &Header::new(Algorithm::HS256),
        &json!({ "sub": "short", "exp": exp, "channels": ["chat:*"] }),
        &EncodingKey::from_secret(JWT_SECRET.as_bytes()),
    )
    .unwrap();
    let mut c = Connection::connect(&ConnectOptions::token(&srv.url, token)).await.unwrap();
    assert_eq!(c.subscribe("chat:exp", None).await.unwrap().kind, "ok");
    let (frames, code) = tokio::time::timeout(Duration::from_secs(6), read_until_closed(&mut c))
        .await
        .expect("closed at exp + leeway, long before the next ping (60 s)");
    let at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
    assert_eq!(code, Some(4003));
    assert!(frames.iter().any(|f| f.kind == "disconnect" && f.reconnect == Some(true)));
    let due = (exp + 1) as f64;
    assert!(at >= due - 0.05, "not before exp + leeway: closed at {at}, due {due}");
    assert!(at <= due + 1.5, "at exp + leeway: closed at {at}, due {due}");
    assert_eq!(metric(&srv, r#"herald_closes_total{reason="token_expired"}"#), 1);
}
