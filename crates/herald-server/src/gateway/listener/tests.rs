use super::*;

const T: Timeouts = Timeouts { header_read: Duration::from_secs(10), idle: Duration::from_secs(120) };

/// Run the watchdog until it fires; returns the reason and when.
async fn fires(conn: &Conn) -> (&'static str, Duration) {
    let start = Instant::now();
    let reason = watchdog(conn, &T).await;
    (reason, start.elapsed())
}

#[tokio::test(start_paused = true)]
async fn a_silent_connection_times_out_at_the_header_read_timeout() {
    let conn = Conn::new(1, Instant::now(), std::sync::Weak::new());
    assert_eq!(fires(&conn).await, ("header_timeout", T.header_read));
}

#[tokio::test(start_paused = true)]
async fn the_first_head_is_timed_from_accept() {
    let conn = Conn::new(1, Instant::now(), std::sync::Weak::new());
    tokio::time::advance(Duration::from_secs(9)).await;
    conn.on_read();
    assert_eq!(fires(&conn).await, ("header_timeout", Duration::from_secs(1)));
}

#[tokio::test(start_paused = true)]
async fn keep_alive_pauses_get_the_idle_timeout_and_the_next_head_its_own_clock() {
    let conn = Conn::new(1, Instant::now(), std::sync::Weak::new());
    conn.on_read();
    conn.begin_request();
    conn.end_request(false);
    // Idle for longer than a header timeout: still open.
    tokio::time::advance(Duration::from_secs(100)).await;
    assert!(tokio::time::timeout(Duration::from_secs(1), watchdog(&conn, &T)).await.is_err());
    // The next request's first byte starts the header clock.
    conn.on_read();
    assert_eq!(fires(&conn).await, ("header_timeout", T.header_read));
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_closes_at_the_idle_timeout_unless_its_answer_is_still_going_out() {
    let conn = Conn::new(1, Instant::now(), std::sync::Weak::new());
    conn.begin_request();
    conn.end_request(false);
    tokio::time::advance(Duration::from_secs(100)).await;
    conn.on_write();
    assert_eq!(fires(&conn).await, ("idle_timeout", T.idle));
}

#[tokio::test(start_paused = true)]
async fn busy_and_upgraded_connections_have_no_deadline_here() {
    let conn = Conn::new(1, Instant::now(), std::sync::Weak::new());
    conn.begin_request();
    conn.on_read(); // body bytes
    assert!(tokio::time::timeout(Duration::from_secs(3600), watchdog(&conn, &T)).await.is_err());
    conn.end_request(true);
    conn.on_read();
    assert!(tokio::time::timeout(Duration::from_secs(3600), watchdog(&conn, &T)).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn the_victim_is_the_oldest_unserved_then_the_oldest_idle_never_a_busy_one() {
    let epoch = Instant::now();
    let mk = |id: u64| Arc::new(Conn::new(id, epoch, std::sync::Weak::new()));
    let (busy, idle, head, fresh) = (mk(1), mk(2), mk(3), mk(4));
    busy.begin_request();
    idle.begin_request();
    idle.end_request(false);
    head.on_read();
    let mut open: BTreeMap<u64, Arc<Conn>> =
        [busy.clone(), idle.clone(), head.clone(), fresh.clone()].into_iter().map(|c| (c.id, c)).collect();
    assert_eq!(victim(&open), Some(3), "oldest that never had a request");
    open.remove(&3);
    assert_eq!(victim(&open), Some(4));
    open.remove(&4);
    assert_eq!(victim(&open), Some(2), "then the oldest keep-alive connection");
    open.remove(&2);
    assert_eq!(victim(&open), None, "a request in progress is never evicted");
}

#[test]
fn the_registry_evicts_at_the_cap_and_rejects_when_all_are_busy() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    rt.block_on(async {
        let metrics = Arc::new(Metrics::default());
        let conns = Arc::new(Connections::new(2, metrics.clone()));
        let a = conns.admit().unwrap();
        let b = conns.admit().unwrap();
        b.begin_request();
        let c = conns.admit().unwrap();
        assert!(a.evicted.is_cancelled() && !b.evicted.is_cancelled());
        c.begin_request();
        assert!(conns.admit().is_none());
        conns.release(b.id);
        assert!(conns.admit().is_some());
        let text = metrics.render();
        assert!(text.contains("herald_http_connections_dropped_total{reason=\"evicted\"} 1"), "{text}");
        assert!(text.contains("herald_http_connections_dropped_total{reason=\"rejected\"} 1"), "{text}");
        assert!(text.contains("herald_http_connections 2"), "{text}");
    });
}

#[test]
fn only_hypers_own_bodiless_error_answers_are_replaced() {
    let auto =
        b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: Mon, 01 Jan 2024 00:00:00 GMT\r\n\r\n";
    let out = io::problem_answer(auto).expect("replaced");
    let text = std::str::from_utf8(&out).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{head}");
    assert!(head.contains("content-type: application/problem+json"));
    assert!(head.contains("date: Mon, 01 Jan 2024 00:00:00 GMT"));
    assert!(head.contains(&format!("content-length: {}", body.len())));
    let problem: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(problem["code"], "bad_request");
    let big =
        b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
    assert!(std::str::from_utf8(&io::problem_answer(big).unwrap()).unwrap().contains("headers_too_large"));
    for ours in [
        &b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/problem+json\r\ncontent-length: 0\r\n\r\n"[..],
        b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n\r\n",
        b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
    ] {
        assert!(io::problem_answer(ours).is_none(), "{}", String::from_utf8_lossy(ours));
    }
}
