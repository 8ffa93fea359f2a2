//! HTTP/2 over cleartext with prior knowledge, beside HTTP/1.1 on the same
//! port (`http.http2`): many publishes in flight on one connection, each
//! answered and appended once; the API's limits and problem documents
//! hold; a preface that stalls is closed by `http.header_read_timeout`;
//! with `http2 = false` the preface is not HTTP/1.1 either and is refused.

use std::time::Duration;

use futures_util::future::join_all;
use herald_test_support::*;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn h2_client() -> reqwest::Client {
    reqwest::Client::builder().http2_prior_knowledge().build().expect("client")
}

/// `herald_http_connections_opened_total` from `/metrics`.
async fn connections_opened<E: herald_core::Engine + 'static>(srv: &TestServer<E>) -> u64 {
    let text = srv.get("/metrics").await.body;
    let text = text.as_str().expect("metrics are text");
    text.lines()
        .find_map(|l| l.strip_prefix("herald_http_connections_opened_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the counter is exported")
}

/// A keyed publish of `{"n": i}`: the version, status, whether the answer
/// is a replay (`Idempotent-Replayed`), and the receipt.
async fn publish_h2(
    client: &reqwest::Client,
    url: &str,
    i: usize,
    key: &str,
) -> (reqwest::Version, u16, bool, Value) {
    let r = client
        .post(format!("{url}/api/v1/channels/chat:h2/messages"))
        .bearer_auth(API_KEY)
        .header("Idempotency-Key", key)
        .json(&json!({ "data": { "n": i } }))
        .send()
        .await
        .expect("request");
    let version = r.version();
    let status = r.status().as_u16();
    let replayed = r.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
    (version, status, replayed, r.json().await.expect("json body"))
}

#[tokio::test]
async fn publishes_multiplex_on_one_http2_connection() {
    let srv = TestServer::start().await;
    let mut sub = srv.connect("reader").await;
    sub.subscribe("chat:h2", None).await.unwrap();
    let before = connections_opened(&srv).await;

    let client = h2_client();
    let url = srv.url.clone();
    let answers = join_all((0..200).map(|i| {
        let (client, url) = (client.clone(), url.clone());
        async move { publish_h2(&client, &url, i, &format!("key-{i}")).await }
    }))
    .await;
    let mut appended: Vec<u64> = answers
        .iter()
        .map(|(version, status, replayed, body)| {
            assert_eq!(*version, reqwest::Version::HTTP_2);
            assert_eq!(*status, 201, "{body}");
            assert!(!replayed, "{body}");
            body["seq"].as_u64().expect("a seq")
        })
        .collect();
    appended.sort_unstable();
    assert_eq!(appended, (1..=200).collect::<Vec<_>>(), "each publish appended once");

    // One connection carried all 200 (the harness reads metrics on its own
    // keep-alive HTTP/1.1 connection, opened before).
    assert_eq!(connections_opened(&srv).await - before, 1, "200 requests multiplexed on one connection");

    // A retry on the same connection is a replay, not a second append.
    let (_, status, replayed, body) = publish_h2(&client, &url, 7, "key-7").await;
    assert_eq!(status, 201, "{body}");
    assert!(replayed, "{body}");
    assert_eq!(body["seq"], answers[7].3["seq"], "{body}");

    let got = next_messages(&mut sub, 200).await;
    assert_eq!(seqs(&got), (1..=200).collect::<Vec<_>>(), "the subscriber sees every message once, in order");
    assert_eq!(srv.history("chat:h2").await.len(), 200);
}

#[tokio::test]
async fn limits_and_problem_documents_hold_over_http2() {
    let srv = TestServer::start_with(|c| c.http.max_body_bytes = 1024).await;
    let client = h2_client();
    // A body above the limit: 413 with a problem document.
    let r = client
        .post(format!("{}/api/v1/channels/chat:big/messages", srv.url))
        .bearer_auth(API_KEY)
        .header("content-type", "application/json")
        .body(format!(r#"{{"data":"{}"}}"#, "x".repeat(4096)))
        .send()
        .await
        .expect("request");
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    assert_eq!(r.status().as_u16(), 413);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], "payload_too_large", "{body}");
    // A wrong API key: 401, and the connection serves the next request.
    let r = client
        .post(format!("{}/api/v1/channels/chat:big/messages", srv.url))
        .bearer_auth("not-a-key-of-this-server")
        .json(&json!({ "data": 1 }))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 401);
    let r = client.get(format!("{}/healthz", srv.url)).send().await.expect("request");
    assert_eq!(r.status().as_u16(), 200);
    assert!(srv.history("chat:big").await.is_empty(), "nothing refused was appended");
}

#[tokio::test]
async fn a_stalled_preface_is_closed_at_the_header_timeout() {
    let srv = TestServer::start_with(|c| c.http.header_read_timeout = Duration::from_millis(300)).await;
    let mut s = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(WAIT, s.read_to_end(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(_)) | Ok(Err(_))), "the server closed the connection within the bound");
    let text = srv.get("/metrics").await.body;
    assert!(
        text.as_str()
            .unwrap()
            .contains(r#"herald_http_connections_dropped_total{reason="header_timeout"} 1"#),
        "{text}"
    );
}

#[tokio::test]
async fn with_http2_off_a_preface_is_refused() {
    let srv = TestServer::start_with(|c| c.http.http2 = false).await;
    let r = h2_client().get(format!("{}/healthz", srv.url)).send().await;
    assert!(r.is_err(), "HTTP/2 refused: {r:?}");
    // HTTP/1.1 is served as ever.
    assert_eq!(srv.get("/healthz").await.status, 200);
}
