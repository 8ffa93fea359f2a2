//! The fault suite's clients, all bounded and stopped on drop: publishers
//! that retry a `503` with the same `Idempotency-Key` (so each tag has one
//! effect) and time every attempt; subscribers that record every message
//! frame for the history checker and resume with `since` after any close;
//! presence members that keep reading (so they answer the server's pings,
//! as every WebSocket client does) and can close cleanly or go silent.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herald_client::{ConnectOptions, Connection, ServerEvent};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use herald_test_support::history::{History, Presence};
use herald_test_support::API_KEY;

/// One HTTP client for a test.
pub fn http() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("http client")
}

/// `POST` one message `{"tag": tag}` with `Idempotency-Key: tag`:
/// `(status, body)`; `(0, Null)` when no answer came.
pub async fn publish(http: &reqwest::Client, url: &str, channel: &str, tag: &str) -> (u16, Value) {
    let r = http
        .post(format!("{url}/api/v1/channels/{channel}/messages"))
        .bearer_auth(API_KEY)
        .header("Idempotency-Key", tag)
        .json(&json!({ "data": { "tag": tag } }))
        .send()
        .await;
    match r {
        Ok(r) => {
            let status = r.status().as_u16();
            if status == 503 {
                assert!(r.headers().get("retry-after").is_some(), "a 503 says when to retry");
            }
            (status, r.json().await.unwrap_or(Value::Null))
        }
        Err(_) => (0, Value::Null),
    }
}

pub async fn readyz(http: &reqwest::Client, url: &str) -> u16 {
    http.get(format!("{url}/readyz")).send().await.map(|r| r.status().as_u16()).unwrap_or(0)
}

/// The client ids a node lists on a presence channel (`None` if it could
/// not answer).
pub async fn listing(http: &reqwest::Client, url: &str, channel: &str) -> Option<Vec<String>> {
    let r = http
        .get(format!("{url}/api/v1/channels/{channel}/presence"))
        .bearer_auth(API_KEY)
        .send()
        .await
        .ok()?;
    if r.status().as_u16() != 200 {
        return None;
    }
    let body: Value = r.json().await.ok()?;
    let members = body["members"].as_array()?;
    Some(members.iter().filter_map(|m| m["client_id"].as_str().map(str::to_owned)).collect())
}

/// Every tag in a channel's log as it stands (the history API, paged).
pub async fn log_tags(http: &reqwest::Client, url: &str, channel: &str) -> HashSet<String> {
    let mut tags = HashSet::new();
    let mut after = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = http
            .get(format!("{url}/api/v1/channels/{channel}/messages?after={after}&limit=1000"))
            .bearer_auth(API_KEY)
            .send()
            .await;
        let body: Value = match r {
            Ok(r) if r.status().as_u16() == 200 => r.json().await.expect("history json"),
            _ => {
                assert!(Instant::now() < deadline, "history of {channel} not readable");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let msgs = body["messages"].as_array().expect("messages").clone();
        let Some(last) = msgs.last() else { return tags };
        after = last["seq"].as_u64().expect("seq");
        tags.extend(msgs.iter().filter_map(|m| m["data"]["tag"].as_str().map(str::to_owned)));
    }
}

/// One publish attempt: when it was answered, and how.
#[derive(Debug, Clone, Copy)]
pub struct Attempt {
    pub at: Instant,
    pub status: u16,
}

/// Publishes `<name>-<n>` to a channel every `every`, retrying a failure
/// with the same key until it is acknowledged. At most `max` tags.
pub struct Publisher {
    pub attempts: Arc<Mutex<Vec<Attempt>>>,
    stop: Arc<AtomicBool>,
    task: Option<JoinHandle<()>>,
}

impl Publisher {
    pub fn start(name: &str, url: &str, channel: &str, every: Duration, history: Arc<History>) -> Self {
        let attempts: Arc<Mutex<Vec<Attempt>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (name, url, channel) = (name.to_owned(), url.to_owned(), channel.to_owned());
        let (a, s) = (attempts.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let http = http();
            for n in 0..100_000u64 {
                let tag = format!("{name}-{n}");
                loop {
                    let (status, body) = publish(&http, &url, &channel, &tag).await;
                    a.lock().unwrap_or_else(|e| e.into_inner()).push(Attempt { at: Instant::now(), status });
                    if (200..300).contains(&status) {
                        let epoch = body["epoch"].as_str().expect("epoch");
                        history.acked(&tag, epoch, body["seq"].as_u64().expect("seq"));
                        break;
                    }
                    if s.load(Ordering::Acquire) {
                        return; // an unknown outcome: maybe in the log, never acknowledged
                    }
                    tokio::time::sleep(every).await;
                }
                if s.load(Ordering::Acquire) {
                    return;
                }
                tokio::time::sleep(every).await;
            }
        });
        Publisher { attempts, stop, task: Some(task) }
    }

    /// Stop after the publish in progress (a retry loop gives up).
    pub async fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(15), t).await;
        }
    }

    /// The first attempt answered at or after `from` with a status in `ok`.
    pub fn first_after(&self, from: Instant, ok: impl Fn(u16) -> bool) -> Option<Instant> {
        let a = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
        a.iter().filter(|x| x.at >= from && ok(x.status)).map(|x| x.at).min()
    }

    /// Statuses answered at or after `from`.
    pub fn statuses_after(&self, from: Instant) -> Vec<u16> {
        let a = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
        a.iter().filter(|x| x.at >= from).map(|x| x.status).collect()
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// Subscribes `name` to a channel on a node and records every message for
/// the history checker; after any close it resumes with `since` (and
/// records a resync when told so).
pub struct Subscriber {
    task: JoinHandle<()>,
}

impl Subscriber {
    pub async fn start(name: &str, url: &str, channel: &str, history: Arc<History>) -> Self {
        history.subscriber(name);
        let (name, url, channel) = (name.to_owned(), url.to_owned(), channel.to_owned());
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            let mut since: Option<(u64, String)> = None;
            loop {
                let Ok(mut conn) = Connection::connect(&ConnectOptions::dev_user(&url, &name)).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let ok = match conn.subscribe(&channel, since.as_ref().map(|(s, e)| (*s, e.as_str()))).await {
                    Ok(ok) if ok.kind == "ok" => ok,
                    _ => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                if ok.epoch_changed == Some(true) {
                    history.resynced(&name);
                }
                let epoch = ok.epoch.clone().expect("a durable subscribe says its epoch");
                match &since {
                    // Live from the head.
                    None => since = Some((ok.head.unwrap_or(0), epoch.clone())),
                    // Resumed in another epoch: from its `first`.
                    Some((_, e)) if *e != epoch => {
                        since = Some((ok.first.unwrap_or(1).saturating_sub(1), epoch.clone()))
                    }
                    Some(_) => {}
                }
                if let Some(tx) = ready.take() {
                    let _ = tx.send(());
                }
                loop {
                    match conn.next_frame().await {
                        Ok(Some(ServerEvent::Frame(f))) if f.kind == "message" => {
                            let seq = f.seq.expect("durable messages have a seq");
                            let data: Value = serde_json::from_str(f.data.as_ref().expect("data").get())
                                .expect("json data");
                            let tag = data["tag"].as_str().unwrap_or("").to_owned();
                            history.received(&name, &epoch, seq, &tag);
                            since = Some((seq, epoch.clone()));
                        }
                        Ok(Some(ServerEvent::Frame(_))) => {}
                        Ok(Some(ServerEvent::Closed { code, .. })) => {
                            if code == Some(herald_proto::close::RESYNC) {
                                history.resynced(&name);
                            }
                            break;
                        }
                        Ok(None) | Err(_) => break,
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        let _ = tokio::time::timeout(Duration::from_secs(20), ready_rx).await;
        Subscriber { task }
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What to do with a member's connection.
pub enum MemberCmd {
    /// Send a close frame and drop the socket (a clean close), without
    /// waiting for the server (it may be stopped).
    Close,
}

/// A presence member: subscribed to a presence channel as `client_id`,
/// reading all the time. With `presence`, it is an observer too: every
/// `join` it sees is recorded, and every `join`/`leave` is kept in order.
pub struct Member {
    pub client_id: String,
    pub events: Arc<Mutex<Vec<(String, String, Instant)>>>,
    cmd: mpsc::Sender<MemberCmd>,
    task: JoinHandle<()>,
}

impl Member {
    pub async fn join(
        url: &str,
        channel: &str,
        user: &str,
        client_id: &str,
        presence: Option<Arc<Presence>>,
    ) -> Self {
        let mut conn = Connection::connect(&ConnectOptions::dev_user(url, user)).await.expect("connect");
        let ok = conn
            .request(json!({ "type": "subscribe", "channel": channel, "client_id": client_id }))
            .await
            .expect("subscribe");
        assert_eq!(ok.kind, "ok", "{ok:?}");
        let events: Arc<Mutex<Vec<(String, String, Instant)>>> = Arc::default();
        let (cmd, mut rx) = mpsc::channel(1);
        let ev = events.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    c = rx.recv() => {
                        if let Some(MemberCmd::Close) = c {
                            let _ = tokio::time::timeout(Duration::from_millis(300), conn.close(None, "bye")).await;
                        }
                        return;
                    }
                    f = conn.next_frame() => match f {
                        Ok(Some(ServerEvent::Frame(f))) if f.kind == "join" || f.kind == "leave" => {
                            let id = f.member.map(|m| m.client_id).unwrap_or_default();
                            if f.kind == "join" {
                                if let Some(p) = &presence {
                                    p.join_seen(&id);
                                }
                            }
                            ev.lock().unwrap_or_else(|e| e.into_inner()).push((f.kind, id, Instant::now()));
                        }
                        Ok(Some(ServerEvent::Frame(_))) => {}
                        _ => return,
                    }
                }
            }
        });
        Member { client_id: client_id.to_owned(), events, cmd, task }
    }

    /// Close cleanly (a close frame, then the socket), now.
    pub async fn close(&self) {
        let _ = self.cmd.send(MemberCmd::Close).await;
    }

    /// When `kind` (`join`/`leave`) of `client_id` was first seen, at or
    /// after `from`.
    pub fn seen(&self, kind: &str, client_id: &str, from: Instant) -> Option<Instant> {
        let ev = self.events.lock().unwrap_or_else(|e| e.into_inner());
        ev.iter().find(|(k, c, at)| k == kind && c == client_id && *at >= from).map(|(_, _, at)| *at)
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.task.abort();
    }
}
