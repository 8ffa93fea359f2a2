use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{within, FakeServer};
use crate::{ClientError, HttpApi, Meta};

/// Answer one HTTP request with `response`; return the full request text.
async fn answer_once(server: &FakeServer, response: String) -> String {
    let mut s = server.accept_raw().await;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "client closed before sending a full request");
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf);
        if let Some(head_end) = text.find("\r\n\r\n") {
            let len = text[..head_end]
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length").then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= head_end + 4 + len {
                break;
            }
        }
    }
    s.write_all(response.as_bytes()).await.unwrap();
    String::from_utf8(buf).unwrap()
}

fn response(status: &str, content_type: &str, extra: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n{body}",
        body.len()
    )
}

#[tokio::test]
async fn publish_sends_key_and_auth_and_reads_replays() {
    within(async {
        let server = FakeServer::start().await;
        let api = HttpApi::new(&server.url(), "api-key-1");
        let script = tokio::spawn(async move {
            let body = r#"{"channel":"chat:1","seq":8,"id":"m8","epoch":"E"}"#;
            let req = answer_once(&server, response("201 Created", "application/json", "", body)).await;
            let req2 = answer_once(
                &server,
                response("201 Created", "application/json", "idempotent-replayed: true\r\n", body),
            )
            .await;
            (req, req2)
        });
        let mut meta = Meta::new();
        meta.insert("trace_id".into(), "t1".into());
        let r = api.publish("chat:1", &json!({ "text": "hi" }), Some(&meta), Some("k1")).await.unwrap();
        assert_eq!((r.status, r.seq, r.id.as_str(), r.epoch.as_deref()), (201, Some(8), "m8", Some("E")));
        assert!(!r.replayed);
        let r = api.publish("chat:1", &json!({ "text": "hi" }), Some(&meta), Some("k1")).await.unwrap();
        assert!(r.replayed);
        assert_eq!(r.seq, Some(8));

        let (req, _) = script.await.unwrap();
        let lower = req.to_ascii_lowercase();
        assert!(req.starts_with("POST /api/v1/channels/chat:1/messages HTTP/1.1\r\n"), "{req}");
        assert!(lower.contains("authorization: bearer api-key-1\r\n"), "{req}");
        assert!(lower.contains("idempotency-key: k1\r\n"), "{req}");
        assert!(lower.contains("content-type: application/json\r\n"), "{req}");
        assert!(req.ends_with(r#"{"data":{"text":"hi"},"meta":{"trace_id":"t1"}}"#), "{req}");
    })
    .await;
}

#[tokio::test]
async fn problem_responses_become_api_errors_with_the_code() {
    within(async {
        let server = FakeServer::start().await;
        let api = HttpApi::new(&server.url(), "k");
        let script = tokio::spawn(async move {
            let body = r#"{"type":"urn:herald:error:idempotency_key_reused","title":"t","status":422,"code":"idempotency_key_reused","detail":"d"}"#;
            answer_once(&server, response("422 Unprocessable Entity", "application/problem+json", "", body)).await;
            let body = r#"{"type":"urn:herald:error:bad_json","title":"t","status":400,"code":"bad_json"}"#;
            answer_once(&server, response("400 Bad Request", "application/problem+json", "", body)).await;
        });
        let err = api.publish("chat:1", &json!(1), None, Some("k")).await.unwrap_err();
        assert!(matches!(err, ClientError::Api { status: 422, .. }), "{err:?}");
        assert_eq!(err.code(), Some("idempotency_key_reused"));
        assert_eq!(err.http_status(), Some(422));

        let raw = api.publish_raw("chat:1", "{not json", None).await.unwrap();
        assert_eq!(raw.status, 400);
        assert_eq!(raw.header("content-type"), Some("application/problem+json"));
        assert_eq!(raw.problem().unwrap().code, "bad_json");
        script.await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn history_builds_the_query_and_parses_messages() {
    within(async {
        let server = FakeServer::start().await;
        let api = HttpApi::new(&format!("{}/", server.url()), "k");
        let script = tokio::spawn(async move {
            let body = r#"{"channel":"chat:1","epoch":"E","first":1,"head":9,"messages":[{"seq":4,"id":"m4","ts":5,"data":{"a":[1, 2]}}]}"#;
            answer_once(&server, response("200 OK", "application/json", "", body)).await
        });
        let h = api.history("chat:1", Some(3), Some(1)).await.unwrap();
        assert_eq!((h.epoch.as_deref(), h.first, h.head), (Some("E"), 1, 9));
        assert_eq!(h.messages.len(), 1);
        assert_eq!(h.messages[0].seq, 4);
        assert_eq!(h.messages[0].data.get(), r#"{"a":[1, 2]}"#, "data stays raw");
        let req = script.await.unwrap();
        assert!(req.starts_with("GET /api/v1/channels/chat:1/messages?after=3&limit=1 HTTP/1.1\r\n"), "{req}");
    })
    .await;
}

#[tokio::test]
async fn anonymous_requests_carry_no_credentials() {
    within(async {
        let server = FakeServer::start().await;
        let api = HttpApi::anonymous(&server.url());
        let script =
            tokio::spawn(
                async move { answer_once(&server, response("200 OK", "text/plain", "", "ok")).await },
            );
        let r = api.get("/healthz").await.unwrap();
        assert_eq!((r.status, &r.body[..]), (200, &b"ok"[..]));
        let req = script.await.unwrap();
        assert!(!req.to_ascii_lowercase().contains("authorization"), "{req}");
    })
    .await;
}
