//! Connections before their request is complete (timeouts, the HTTP
//! connection cap) and what browsers get (Origin check, CORS, response
//! headers, parser errors as problem documents). Timeouts are configured
//! short so each case takes a second or so; every wait is bounded by `WAIT`.

use std::time::Duration;

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use herald_test_support::*;

/// An HTTP response read off a raw socket.
#[derive(Debug)]
struct Raw {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    fn assert_problem(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.header("content-type"), Some("application/problem+json"), "{self:?}");
        assert_eq!(self.json()["code"], code, "{self:?}");
    }
}

async fn connect(srv: &TestServer) -> TcpStream {
    TcpStream::connect(srv.addr).await.expect("connect")
}

/// One response (head, and a `Content-Length` body); bounded by `WAIT`.
async fn read_response(s: &mut (impl AsyncRead + Unpin)) -> Raw {
    tokio::time::timeout(WAIT, async {
        let mut buf = Vec::new();
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).await.expect("read");
            assert!(n > 0, "connection closed before a response: {:?}", String::from_utf8_lossy(&buf));
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8(buf[..head_end].to_vec()).expect("ascii head");
        let mut lines = head.split("\r\n");
        let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
        let headers: Vec<(String, String)> = lines
            .map(|l| {
                let (n, v) = l.split_once(':').unwrap();
                (n.trim().to_ascii_lowercase(), v.trim().to_owned())
            })
            .collect();
        let mut body = buf[head_end + 4..].to_vec();
        let len = headers.iter().find(|(n, _)| n == "content-length").map_or(0, |(_, v)| v.parse().unwrap());
        while body.len() < len {
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).await.expect("read body");
            assert!(n > 0, "connection closed in the body");
            body.extend_from_slice(&chunk[..n]);
        }
        Raw { status, headers, body }
    })
    .await
    .expect("a response in time")
}

/// Wait until the server closes the socket (EOF or reset), discarding
/// anything it sends; returns the bytes received. Bounded by `WAIT`.
async fn closed_by_server(s: &mut (impl AsyncRead + Unpin)) -> Vec<u8> {
    let mut got = Vec::new();
    tokio::time::timeout(WAIT, async {
        let mut chunk = [0u8; 4096];
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await
    .expect("the server closes the connection in time");
    got
}

/// Whether the server has closed this socket, without waiting.
fn is_closed(s: &TcpStream) -> bool {
    let mut b = [0u8; 64];
    match s.try_read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

/// A metric's value from `/metrics` (0 when absent).
async fn metric(srv: &TestServer, series: &str) -> u64 {
    let text = fresh_client().get(format!("{}/metrics", srv.url)).send().await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// A client that opens a new connection for every request (no pool).
fn fresh_client() -> reqwest::Client {
    reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap()
}

fn publish_head(body_headers: &str) -> String {
    format!(
        "POST /api/v1/channels/chat:abuse/messages HTTP/1.1\r\nHost: herald\r\n\
         Authorization: Bearer {API_KEY}\r\nContent-Type: application/json\r\n{body_headers}\r\n"
    )
}

#[tokio::test]
async fn a_connection_that_never_sends_a_byte_is_closed_at_the_header_read_timeout() {
    let srv = TestServer::start_with(|c| c.http.header_read_timeout = Duration::from_millis(300)).await;
    let mut s = connect(&srv).await;
    assert!(closed_by_server(&mut s).await.is_empty(), "closed without an answer");
    assert!(metric(&srv, "herald_http_connections_dropped_total{reason=\"header_timeout\"}").await >= 1);
}

#[tokio::test]
async fn headers_sent_slowly_are_cut_at_the_header_read_timeout() {
    let srv = TestServer::start_with(|c| c.http.header_read_timeout = Duration::from_millis(500)).await;
    let (mut rd, mut wr) = connect(&srv).await.into_split();
    wr.write_all(b"GET /healthz HTTP/1.1\r\nHost: herald\r\n").await.unwrap();
    // One header line every 100 ms, for ever: the head never completes.
    let trickle = tokio::spawn(async move {
        for i in 0.. {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if wr.write_all(format!("X-Slow-{i}: 1\r\n").as_bytes()).await.is_err() {
                return;
            }
        }
    });
    assert!(closed_by_server(&mut rd).await.is_empty(), "closed without an answer");
    trickle.abort();
    assert!(metric(&srv, "herald_http_connections_dropped_total{reason=\"header_timeout\"}").await >= 1);
}

#[tokio::test]
async fn an_unfinished_chunked_body_gets_408() {
    let srv = TestServer::start_with(|c| c.http.body_read_timeout = Duration::from_millis(500)).await;
    let mut s = connect(&srv).await;
    let req = publish_head("Transfer-Encoding: chunked\r\n") + "5\r\n{\"dat\r\n";
    s.write_all(req.as_bytes()).await.unwrap();
    let r = read_response(&mut s).await;
    r.assert_problem(408, "request_timeout");
    closed_by_server(&mut s).await;
    assert!(srv.history("chat:abuse").await.is_empty());
    assert!(metric(&srv, "herald_http_connections_dropped_total{reason=\"body_timeout\"}").await >= 1);
}

#[tokio::test]
async fn a_chunked_body_above_the_limit_gets_413_and_appends_nothing() {
    // No Content-Length to refuse up front: the body is cut at
    // `http.max_body_bytes` while it is read (extract::Body).
    let srv = TestServer::start_with(|c| c.http.max_body_bytes = 1024).await;
    let mut s = connect(&srv).await;
    let body = format!("{{\"data\":\"{}\"}}", "x".repeat(2000));
    let req =
        publish_head("Transfer-Encoding: chunked\r\n") + &format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len());
    s.write_all(req.as_bytes()).await.unwrap();
    read_response(&mut s).await.assert_problem(413, "payload_too_large");
    assert!(srv.history("chat:abuse").await.is_empty());
    // The limit is ours, not the framework's default (2 MB): a body just
    // under it is taken.
    let r = srv.publish("chat:abuse", serde_json::json!("y".repeat(900))).await;
    assert_eq!(r.status, 201);
}

#[tokio::test]
async fn a_body_trickled_a_byte_at_a_time_gets_408_at_its_deadline() {
    let srv = TestServer::start_with(|c| c.http.body_read_timeout = Duration::from_millis(500)).await;
    let (mut rd, mut wr) = connect(&srv).await.into_split();
    let body = format!("{{\"data\":\"{}\"}}", "x".repeat(200));
    wr.write_all(publish_head(&format!("Content-Length: {}\r\n", body.len())).as_bytes()).await.unwrap();
    // A byte every 50 ms: each arrives well within any per-read timeout,
    // the whole body would take 10 s.
    let trickle = tokio::spawn(async move {
        for b in body.into_bytes() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if wr.write_all(&[b]).await.is_err() {
                return;
            }
        }
    });
    read_response(&mut rd).await.assert_problem(408, "request_timeout");
    trickle.abort();
}

#[tokio::test]
async fn a_huge_content_length_is_refused_with_413_without_reading_the_body() {
    // The body deadline (30 s by default) is longer than WAIT: an answer in
    // time means the server did not wait for the body.
    let srv = TestServer::start().await;
    let mut s = connect(&srv).await;
    s.write_all(publish_head("Content-Length: 100000000000\r\n").as_bytes()).await.unwrap();
    let r = read_response(&mut s).await;
    r.assert_problem(413, "payload_too_large");
    closed_by_server(&mut s).await;
}

#[tokio::test]
async fn a_keep_alive_connection_gets_the_idle_timeout_between_requests_then_is_closed() {
    let srv = TestServer::start_with(|c| {
        c.http.header_read_timeout = Duration::from_millis(200);
        c.http.keep_alive_timeout = Duration::from_secs(2);
    })
    .await;
    let mut s = connect(&srv).await;
    let get = b"GET /healthz HTTP/1.1\r\nHost: herald\r\n\r\n";
    s.write_all(get).await.unwrap();
    assert_eq!(read_response(&mut s).await.status, 200);
    // A pause longer than the header timeout is a keep-alive pause, not a
    // slow head: the connection still serves the next request.
    tokio::time::sleep(Duration::from_millis(600)).await;
    s.write_all(get).await.unwrap();
    assert_eq!(read_response(&mut s).await.status, 200);
    assert!(closed_by_server(&mut s).await.is_empty());
    assert!(metric(&srv, "herald_http_connections_dropped_total{reason=\"idle_timeout\"}").await >= 1);
}

#[tokio::test]
async fn websocket_sessions_are_not_bound_by_the_http_timeouts() {
    let srv = TestServer::start_with(|c| {
        c.http.header_read_timeout = Duration::from_millis(100);
        c.http.keep_alive_timeout = Duration::from_millis(100);
    })
    .await;
    let mut c = srv.connect("ws").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(c.ping().await.unwrap().kind, "pong");
}

#[tokio::test]
async fn at_the_cap_silent_sockets_are_evicted_and_healthz_still_answers() {
    let srv = TestServer::start_with(|c| {
        c.websocket.max_connections = 2;
        c.http.max_connections = 16;
        // Longer than the test: only the cap can close the silent sockets.
        c.http.header_read_timeout = Duration::from_secs(60);
    })
    .await;
    // The WebSocket cap is full...
    let _a = srv.connect("a").await;
    let _b = srv.connect("b").await;
    // ...and an attacker holds far more silent sockets than the HTTP cap.
    let mut silent = Vec::new();
    for _ in 0..64 {
        silent.push(connect(&srv).await);
    }
    let health = fresh_client().get(format!("{}/healthz", srv.url)).send().await.expect("healthz answers");
    assert_eq!(health.status(), 200);
    assert_eventually("the oldest silent sockets are closed", || {
        let closed = silent.iter().filter(|s| is_closed(s)).count();
        async move { closed >= 64 - 16 }
    })
    .await;
    assert!(metric(&srv, "herald_http_connections").await <= 16);
    assert!(metric(&srv, "herald_http_connections_dropped_total{reason=\"evicted\"}").await >= 48);
    // An upgrade at the full WebSocket cap still gets its answer.
    upgrade(&srv, "user=c", None).await.assert_problem(503, "too_many_connections");
}

#[tokio::test]
async fn a_request_in_progress_is_never_evicted() {
    let srv = TestServer::start_with(|c| {
        c.http.max_connections = 16;
        c.http.header_read_timeout = Duration::from_secs(60);
    })
    .await;
    let mut s = connect(&srv).await;
    let body = br#"{"data":{"survived":true}}"#;
    let head = publish_head(&format!("Content-Length: {}\r\nExpect: 100-continue\r\n", body.len()));
    s.write_all(head.as_bytes()).await.unwrap();
    // 100 Continue: the request is dispatched and its body being read.
    assert_eq!(read_response(&mut s).await.status, 100);
    s.write_all(&body[..10]).await.unwrap();
    let mut silent = Vec::new();
    for _ in 0..40 {
        silent.push(connect(&srv).await);
    }
    assert_eventually("the flood evicts silent sockets", || async {
        metric(&srv, "herald_http_connections_dropped_total{reason=\"evicted\"}").await >= 24
    })
    .await;
    s.write_all(&body[10..]).await.unwrap();
    let r = read_response(&mut s).await;
    assert_eq!(r.status, 201);
    assert_eq!(srv.history("chat:abuse").await.len(), 1);
}

const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

fn token(sub: &str) -> String {
    let exp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 600;
    let claims = json!({ "sub": sub, "exp": exp, "channels": ["*"] });
    encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(JWT_SECRET.as_bytes())).unwrap()
}

/// A raw WebSocket handshake with `Origin` (if any); the answer's head.
async fn upgrade(srv: &TestServer, query: &str, origin: Option<&str>) -> Raw {
    let mut s = connect(srv).await;
    let origin = origin.map(|o| format!("Origin: {o}\r\n")).unwrap_or_default();
    let req = format!(
        "GET /ws?{query} HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {KEY}\r\n{origin}\r\n",
        srv.addr
    );
    s.write_all(req.as_bytes()).await.unwrap();
    read_response(&mut s).await
}

#[tokio::test]
async fn websocket_upgrades_from_pages_on_other_origins_are_refused_before_the_101() {
    let srv = TestServer::start_with(|c| {
        c.dev = false;
        c.allowed_origins = vec!["https://app.example".into()];
    })
    .await;
    let q = format!("token={}", token("alice"));
    let r = upgrade(&srv, &q, Some("https://evil.example")).await;
    r.assert_problem(403, "origin_not_allowed");
    assert_eq!(upgrade(&srv, &q, Some("null")).await.status, 403);
    // The server's own pages, listed origins and non-browser clients pass.
    let own = format!("http://{}", srv.addr);
    assert_eq!(upgrade(&srv, &q, Some(&own)).await.status, 101);
    assert_eq!(upgrade(&srv, &q, Some("https://app.example")).await.status, 101);
    assert_eq!(upgrade(&srv, &q, None).await.status, 101);
    assert_eq!(metric(&srv, "herald_origin_refused_total").await, 2);
}

#[tokio::test]
async fn dev_mode_and_a_star_allow_every_origin() {
    let dev = TestServer::start().await;
    assert_eq!(upgrade(&dev, "user=u", Some("https://evil.example")).await.status, 101);
    let star = TestServer::start_with(|c| {
        c.dev = false;
        c.allowed_origins = vec!["*".into()];
    })
    .await;
    let q = format!("token={}", token("bob"));
    assert_eq!(upgrade(&star, &q, Some("https://anywhere.example")).await.status, 101);
}

#[tokio::test]
async fn cors_preflights_and_answers_for_configured_origins() {
    let srv = TestServer::start_with(|c| c.cors_origins = vec!["https://app.example".into()]).await;
    let path = "/api/v1/channels/chat:cors/messages";
    let pre = srv
        .call(
            "OPTIONS",
            path,
            None,
            &[
                ("Origin", "https://app.example"),
                ("Access-Control-Request-Method", "POST"),
                ("Access-Control-Request-Headers", "authorization,content-type,idempotency-key"),
            ],
        )
        .await;
    assert_eq!(pre.status, 200, "{:?}", pre.body);
    let h = |r: &Resp, name: &str| r.headers.get(name).map(|v| v.to_str().unwrap().to_ascii_lowercase());
    assert_eq!(h(&pre, "access-control-allow-origin").as_deref(), Some("https://app.example"));
    assert!(h(&pre, "access-control-allow-methods").unwrap().contains("post"));
    let allowed = h(&pre, "access-control-allow-headers").unwrap();
    for name in ["authorization", "content-type", "idempotency-key", "if-match"] {
        assert!(allowed.contains(name), "{allowed}");
    }
    let post = srv
        .call(
            "POST",
            path,
            Some(json!({ "data": 1 })),
            &[("Origin", "https://app.example"), ("Idempotency-Key", "k")],
        )
        .await;
    assert_eq!(post.status, 201);
    assert_eq!(h(&post, "access-control-allow-origin").as_deref(), Some("https://app.example"));
    let exposed = h(&post, "access-control-expose-headers").unwrap();
    for name in ["etag", "idempotent-replayed", "retry-after"] {
        assert!(exposed.contains(name), "{exposed}");
    }
    // Another site gets no CORS permission.
    let other = srv.call("GET", path, None, &[("Origin", "https://evil.example")]).await;
    assert_eq!(h(&other, "access-control-allow-origin"), None);
    // CORS is for the API only.
    let health = srv.call("GET", "/healthz", None, &[("Origin", "https://app.example")]).await;
    assert_eq!(h(&health, "access-control-allow-origin"), None);
}

#[tokio::test]
async fn without_cors_origins_the_api_sends_no_cors_headers_and_options_is_a_problem() {
    let srv = TestServer::start().await;
    let r = srv
        .call(
            "OPTIONS",
            "/api/v1/channels/chat:cors/messages",
            None,
            &[("Origin", "https://app.example"), ("Access-Control-Request-Method", "POST")],
        )
        .await;
    assert_eq!((r.status, r.code()), (405, "method_not_allowed"), "{:?}", r.body);
    assert!(r.is_problem());
    assert!(r.headers.get("access-control-allow-origin").is_none());
    assert!(r.headers.get("allow").unwrap().to_str().unwrap().contains("POST"));
}

#[tokio::test]
async fn answers_are_nosniff_and_api_answers_are_not_stored() {
    let srv = TestServer::start().await;
    for path in ["/api/v1/channels/chat:h/messages", "/api/v1/nope", "/healthz", "/metrics"] {
        let r = srv.get(path).await;
        let h = |name: &str| r.headers.get(name).map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(h("x-content-type-options").as_deref(), Some("nosniff"), "{path}");
        assert_eq!(h("cache-control").as_deref(), Some("no-store"), "{path}");
    }
    // The console's files keep their own revalidation policy.
    let page = srv.get("/console/").await;
    assert_eq!(page.headers.get("cache-control").unwrap(), "no-cache");
    assert_eq!(page.headers.get("x-content-type-options").unwrap(), "nosniff");
}

#[tokio::test]
async fn a_control_byte_in_a_header_gets_a_problem_document() {
    let srv = TestServer::start().await;
    let mut s = connect(&srv).await;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: herald\r\nX-Bad: a\x01b\r\n\r\n").await.unwrap();
    let r = read_response(&mut s).await;
    r.assert_problem(400, "bad_request");
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    closed_by_server(&mut s).await;
    // A broken request line too.
    let mut s = connect(&srv).await;
    s.write_all(b"GET /healthz HTTP/1.1 extra\r\nHost: herald\r\n\r\n").await.unwrap();
    read_response(&mut s).await.assert_problem(400, "bad_request");
}

#[tokio::test]
async fn oversized_headers_get_431_as_a_problem_document() {
    let srv = TestServer::start_with(|c| c.http.max_header_bytes = 2048).await;
    let mut s = connect(&srv).await;
    let req = format!("GET /healthz HTTP/1.1\r\nHost: herald\r\nX-Big: {}\r\n\r\n", "b".repeat(4096));
    s.write_all(req.as_bytes()).await.unwrap();
    read_response(&mut s).await.assert_problem(431, "headers_too_large");
    // Under the limit is fine.
    let mut s = connect(&srv).await;
    let req = format!("GET /healthz HTTP/1.1\r\nHost: herald\r\nX-Big: {}\r\n\r\n", "b".repeat(1024));
    s.write_all(req.as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut s).await.status, 200);
}
