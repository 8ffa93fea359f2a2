//! kill -9 the real binary in the middle of 1,000 concurrent publishes:
//! after a restart every publish that got a 2xx is there, once, in order.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_test_support::{HeraldProcess, API_KEY};
use serde_json::json;

fn spawn(dir: &std::path::Path) -> HeraldProcess {
    spawn_with(dir, &[])
}

fn spawn_with(dir: &std::path::Path, extra: &[&std::ffi::OsStr]) -> HeraldProcess {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
    cmd.args(["serve", "--dev", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .args(extra)
        .env("HERALD_API_KEYS", API_KEY)
        .env("HERALD_LOG", "warn")
        .stderr(Stdio::inherit());
    HeraldProcess::spawn(&mut cmd, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_publish_survives_kill_9() {
    const WORKERS: u64 = 20;
    const PER: u64 = 50;
    let dir = tempfile::tempdir().unwrap();
    let mut proc = spawn(dir.path());
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let acked: Arc<Mutex<HashMap<String, (u64, String)>>> = Arc::default();

    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let (http, url, acked) = (http.clone(), proc.url.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..PER {
                let tag = format!("{w}-{i}");
                let r = http
                    .post(format!("{url}/api/v1/channels/chat:crash/messages"))
                    .bearer_auth(API_KEY)
                    .json(&json!({ "data": { "tag": tag } }))
                    .send()
                    .await;
                let Ok(r) = r else { return };
                if r.status().as_u16() != 201 {
                    return;
                }
                let Ok(body) = r.json::<serde_json::Value>().await else { return };
                let seq = body["seq"].as_u64().unwrap();
                let id = body["id"].as_str().unwrap().to_owned();
                acked.lock().unwrap().insert(tag, (seq, id));
            }
        }));
    }
    // Kill mid-stream.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while acked.lock().unwrap().len() < 300 {
        assert!(std::time::Instant::now() < deadline, "publishes too slow");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    proc.kill9();
    for t in tasks {
        t.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() >= 300 && acked.len() < (WORKERS * PER) as usize,
        "killed mid-stream: {}",
        acked.len()
    );

    let proc = spawn(dir.path());
    let mut stored = Vec::new();
    let mut after = 0;
    loop {
        let r: serde_json::Value = http
            .get(format!("{}/api/v1/channels/chat:crash/messages?after={after}&limit=1000", proc.url))
            .bearer_auth(API_KEY)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let msgs = r["messages"].as_array().unwrap().clone();
        if msgs.is_empty() {
            break;
        }
        after = msgs.last().unwrap()["seq"].as_u64().unwrap();
        stored.extend(msgs);
    }
    drop(proc);

    let seqs: Vec<u64> = stored.iter().map(|m| m["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=stored.len() as u64).collect::<Vec<_>>(), "gap-free and ordered");
    let mut by_tag: HashMap<String, (u64, String)> = HashMap::new();
    for m in &stored {
        let tag = m["data"]["tag"].as_str().unwrap().to_owned();
        let prev =
            by_tag.insert(tag.clone(), (m["seq"].as_u64().unwrap(), m["id"].as_str().unwrap().to_owned()));
        assert!(prev.is_none(), "message {tag} stored twice");
    }
    for (tag, (seq, id)) in &acked {
        assert_eq!(by_tag.get(tag), Some(&(*seq, id.clone())), "acknowledged message {tag} lost or changed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_acks_survive_kill_9() {
    use herald_client::{ConnectOptions, Connection};
    let dir = tempfile::tempdir().unwrap();
    let proc = spawn(dir.path());
    let api = herald_client::HttpApi::new(&proc.url, API_KEY);
    let mut c = Connection::connect(&ConnectOptions::dev_user(&proc.url, "kim")).await.unwrap();
    c.subscribe("user:kim", None).await.unwrap();
    for i in 1..=10 {
        api.publish("user:kim", &json!(i), None, None).await.unwrap();
    }
    let mut got = 0;
    while got < 10 {
        if let Some(herald_client::ServerEvent::Frame(f)) = c.next_frame().await.unwrap() {
            if f.kind == "message" {
                got += 1;
            }
        }
    }
    // The ok reply confirms the engine stored the ack.
    let r = c.request(json!({ "type": "ack", "channel": "user:kim", "seq": 7 })).await.unwrap();
    assert_eq!(r.kind, "ok");
    drop(proc); // SIGKILL, no shutdown

    let proc = spawn(dir.path());
    let mut c = Connection::connect(&ConnectOptions::dev_user(&proc.url, "kim")).await.unwrap();
    let ok = c.subscribe("user:kim", None).await.unwrap();
    assert_eq!((ok.cursor, ok.unread), (Some(7), Some(3)));
    let mut seqs = Vec::new();
    while seqs.len() < 3 {
        if let Some(herald_client::ServerEvent::Frame(f)) =
            tokio::time::timeout(Duration::from_secs(10), c.next_frame()).await.unwrap().unwrap()
        {
            if f.kind == "message" {
                seqs.push(f.seq.unwrap());
            }
        }
    }
    assert_eq!(seqs, vec![8, 9, 10]);
}

/// The node holding a room's host dies with kill -9: after a restart the
/// host's stored lease expires, the room goes to grace, and closes when the
/// stored grace deadline passes — nobody has to be connected for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_whose_node_died_still_closes_after_grace() {
    use herald_client::{ConnectOptions, Connection};
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("herald.toml");
    std::fs::write(&config, "[presence]\nlease_ttl = \"1s\"\nsweep_interval = \"100ms\"\n").unwrap();
    let data = dir.path().join("data");
    let args = [std::ffi::OsStr::new("--config"), config.as_os_str()];
    let proc = spawn_with(&data, &args);
    let api = herald_client::HttpApi::new(&proc.url, API_KEY);
    let body = bytes::Bytes::from(json!({ "host": "h", "grace_period": 2 }).to_string());
    let r = api.request(reqwest::Method::PUT, "/api/v1/rooms/room:k", &[], Some(body)).await.unwrap();
    assert_eq!(r.status, 201);
    let mut host = Connection::connect(&ConnectOptions::dev_user(&proc.url, "h")).await.unwrap();
    assert_eq!(host.subscribe("room:k", None).await.unwrap().kind, "ok");
    let state = |api: herald_client::HttpApi| async move {
        let r = api.get("/api/v1/rooms/room:k").await.unwrap();
        r.json().unwrap()["state"].as_str().unwrap().to_owned()
    };
    herald_test_support::assert_eventually("room is live", || {
        let api = api.clone();
        async move { state(api).await == "live" }
    })
    .await;
    drop(proc); // SIGKILL: the host's lease stays behind, unrenewed
    drop(host);

    let proc = spawn_with(&data, &args);
    let api = herald_client::HttpApi::new(&proc.url, API_KEY);
    herald_test_support::assert_eventually("room is closed", || {
        let api = api.clone();
        async move { state(api).await == "closed" }
    })
    .await;
    let r = api.get("/api/v1/channels/room:k/messages?after=0").await.unwrap().json().unwrap();
    let reasons: Vec<&str> =
        r["messages"].as_array().unwrap().iter().filter_map(|m| m["data"]["reason"].as_str()).collect();
    assert_eq!(reasons, ["created", "host_joined", "host_left", "grace_expired"]);
}
