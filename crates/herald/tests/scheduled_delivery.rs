//! Scheduled delivery through the HTTP API against a real server: a
//! schedule is absent before its time and appended once after; a retried
//! request schedules once; a cancelled one is never delivered; a schedule
//! whose server was killed (`kill -9`) before the due time goes out once
//! at the next start.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use herald_test_support::{assert_eventually, TestServer, API_KEY};
use serde_json::{json, Value};

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

fn datas(history: &[Value]) -> Vec<Value> {
    history.iter().map(|m| m["data"].clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_is_absent_before_its_time_and_present_once_after() {
    let s = TestServer::start().await;
    let before = now_ms();
    let r =
        s.publish_with("chat:later", json!({"data": {"n": 1}, "delay_ms": 2000}), None, Some(API_KEY)).await;
    assert_eq!(r.status, 202, "{:?}", r.body);
    let id = r.body["scheduled_id"].as_str().expect("an id").to_owned();
    assert_eq!(r.body["channel"], "chat:later");
    let at = r.body["deliver_at"].as_u64().unwrap();
    assert!(at >= before + 2000 && at <= now_ms() + 2000, "{at}");
    assert!(s.history("chat:later").await.is_empty(), "nothing appended yet");
    let listed = s.get("/api/v1/scheduled?channel=chat:later").await;
    assert_eq!(listed.status, 200);
    assert_eq!(listed.body["scheduled"][0]["id"], id.as_str());
    assert_eq!(listed.body["scheduled"][0]["deliver_at"], at);
    assert_eq!(listed.body["scheduled"][0]["size"], 7);

    let mut sub = s.connect("u").await;
    sub.subscribe("chat:later", None).await.expect("subscribe");
    let live = herald_test_support::next_messages(&mut sub, 1).await;
    assert!(now_ms() >= at, "not before its time");
    assert_eq!(live[0].data.as_ref().unwrap().get(), r#"{"n":1}"#);
    let h = s.history("chat:later").await;
    assert_eq!(datas(&h), [json!({"n": 1})], "appended once");
    assert!(h[0]["ts"].as_u64().unwrap() >= at);
    let listed = s.get("/api/v1/scheduled?channel=chat:later").await;
    assert_eq!(listed.body["scheduled"], json!([]));
    assert_eq!(s.call("DELETE", &format!("/api/v1/scheduled/{id}"), None, &[]).await.status, 404);
    let metrics = s.get("/metrics").await.body;
    let text = metrics.as_str().unwrap_or_default();
    assert!(text.contains("herald_scheduled_delivered_total 1"), "{text}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_scheduling_request_schedules_once() {
    let s = TestServer::start().await;
    let body = json!({"data": "once", "delay_ms": 500});
    let a = s.publish_with("chat:retry", body.clone(), Some("k1"), Some(API_KEY)).await;
    let b = s.publish_with("chat:retry", body.clone(), Some("k1"), Some(API_KEY)).await;
    assert_eq!((a.status, b.status), (202, 202));
    assert_eq!(a.body, b.body, "the retry replays the 202");
    assert!(a.headers.get("idempotent-replayed").is_none());
    assert_eq!(b.headers.get("idempotent-replayed").unwrap(), "true");
    let other = s
        .publish_with("chat:retry", json!({"data": "other", "delay_ms": 500}), Some("k1"), Some(API_KEY))
        .await;
    assert_eq!(other.status, 422, "{:?}", other.body);
    // The batch endpoint, with a marker scheduled after the rest.
    let batch = json!({"channels": ["chat:retry", "chat:retry2"], "data": "both", "delay_ms": 600});
    let resp = |r: herald_test_support::Resp| (r.status, r.body);
    let x = resp(s.call("POST", "/api/v1/publish", Some(batch.clone()), &[("Idempotency-Key", "k2")]).await);
    let y = resp(s.call("POST", "/api/v1/publish", Some(batch), &[("Idempotency-Key", "k2")]).await);
    assert_eq!(x.0, 202, "{:?}", x.1);
    assert_eq!(x, y);
    assert_eq!(x.1["results"].as_array().unwrap().len(), 2);
    let m =
        s.publish_with("chat:retry", json!({"data": "marker", "delay_ms": 900}), None, Some(API_KEY)).await;
    assert_eq!(m.status, 202);
    assert_eventually("the marker is delivered", || async {
        s.history("chat:retry").await.iter().any(|m| m["data"] == "marker")
    })
    .await;
    assert_eq!(datas(&s.history("chat:retry").await), [json!("once"), json!("both"), json!("marker")]);
    assert_eq!(datas(&s.history("chat:retry2").await), [json!("both")]);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_schedule_is_never_delivered() {
    let s = TestServer::start().await;
    let r = s.publish_with("chat:cancel", json!({"data": "no", "delay_ms": 700}), None, Some(API_KEY)).await;
    let id = r.body["scheduled_id"].as_str().unwrap().to_owned();
    let at = now_ms() + 30_000;
    let marker = s
        .publish_with("chat:cancel", json!({"data": "yes", "deliver_at": at - 29_000}), None, Some(API_KEY))
        .await;
    assert_eq!(marker.status, 202, "{:?}", marker.body);
    let c = s.call("DELETE", &format!("/api/v1/scheduled/{id}"), None, &[]).await;
    assert_eq!(c.status, 200, "{:?}", c.body);
    assert_eq!(c.body["id"], id.as_str());
    assert_eq!(c.body["channel"], "chat:cancel");
    assert_eq!(s.call("DELETE", &format!("/api/v1/scheduled/{id}"), None, &[]).await.status, 404);
    assert_eq!(s.call("DELETE", "/api/v1/scheduled/nope", None, &[]).await.status, 404);
    assert_eventually("the marker is delivered", || async { !s.history("chat:cancel").await.is_empty() })
        .await;
    assert_eq!(datas(&s.history("chat:cancel").await), [json!("yes")], "the cancelled one never was");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduling_requests_are_checked() {
    let s = TestServer::start_with(|c| c.publish.max_schedule_ahead = Duration::from_secs(60)).await;
    let both = s
        .publish_with("chat:bad", json!({"data": 1, "delay_ms": 1, "deliver_at": 1}), None, Some(API_KEY))
        .await;
    assert_eq!((both.status, both.code()), (400, "bad_request"));
    let far = s.publish_with("chat:bad", json!({"data": 1, "delay_ms": 61_000}), None, Some(API_KEY)).await;
    assert_eq!((far.status, far.code()), (400, "bad_request"));
    // In the past: as soon as possible.
    let past = s.publish_with("chat:bad", json!({"data": 1, "deliver_at": 1}), None, Some(API_KEY)).await;
    assert_eq!(past.status, 202);
    assert!(past.body["deliver_at"].as_u64().unwrap() > 1);
    assert_eventually("the past schedule goes out", || async { s.history("chat:bad").await.len() == 1 })
        .await;
    assert_eq!(s.get("/api/v1/scheduled").await.status, 400, "channel is required");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_rooms_schedules_are_cancelled() {
    let s = TestServer::start().await;
    let r = s.call("PUT", "/api/v1/rooms/room:sched", Some(json!({"host": "h"})), &[]).await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let a =
        s.publish_with("room:sched", json!({"data": "later", "delay_ms": 60_000}), None, Some(API_KEY)).await;
    assert_eq!(a.status, 202, "{:?}", a.body);
    let missing = s.publish_with("room:nope", json!({"data": 1, "delay_ms": 10}), None, Some(API_KEY)).await;
    assert_eq!(missing.status, 404, "a room must exist to be scheduled to");
    assert_eq!(
        s.get("/api/v1/scheduled?channel=room:sched").await.body["scheduled"].as_array().unwrap().len(),
        1
    );
    assert_eq!(s.call("DELETE", "/api/v1/rooms/room:sched", None, &[]).await.status, 200);
    let listed = s.get("/api/v1/scheduled?channel=room:sched").await;
    assert_eq!(listed.body["scheduled"], json!([]), "closing the room cancelled it");
    let id = a.body["scheduled_id"].as_str().unwrap();
    assert_eq!(s.call("DELETE", &format!("/api/v1/scheduled/{id}"), None, &[]).await.status, 404);
    s.stop().await;
}

struct Proc {
    child: Child,
    url: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(dir: &std::path::Path) -> Proc {
    let child = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["serve", "--dev", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .env("HERALD_API_KEYS", API_KEY)
        .env("HERALD_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn herald");
    let mut proc = Proc { child, url: String::new() };
    let stdout = proc.child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let first = lines.next().expect("a line").expect("read stdout");
    proc.url = first.strip_prefix("herald listening on ").expect("listening line").trim().to_owned();
    std::thread::spawn(move || for _ in lines {});
    proc
}

async fn history(http: &reqwest::Client, url: &str, channel: &str) -> Vec<Value> {
    let r: Value = http
        .get(format!("{url}/api/v1/channels/{channel}/messages?limit=1000"))
        .bearer_auth(API_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    r["messages"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_due_while_the_server_was_down_go_out_once_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut proc = spawn(dir.path());
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let at = now_ms() + 1500;
    // Scheduled in reverse order of their times: delivered by time, then
    // by schedule order.
    for (data, deliver_at) in [("c", at + 20), ("a", at), ("b", at)] {
        let r = http
            .post(format!("{}/api/v1/channels/chat:down/messages", proc.url))
            .bearer_auth(API_KEY)
            .json(&json!({"data": data, "deliver_at": deliver_at}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
    }
    proc.child.kill().unwrap(); // SIGKILL, before the due time
    proc.child.wait().unwrap();
    while now_ms() < at + 500 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let proc = spawn(dir.path());
    assert_eventually("overdue schedules go out at start", || async {
        history(&http, &proc.url, "chat:down").await.len() >= 3
    })
    .await;
    let h = history(&http, &proc.url, "chat:down").await;
    assert_eq!(datas(&h), [json!("a"), json!("b"), json!("c")], "once each, in order");
    drop(proc);
}
