//! Test harness: a real server on 127.0.0.1:0 with the embedded engine in a
//! temp dir, plus HTTP and WebSocket helpers. Every wait is bounded.
#![allow(dead_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use herald_client::{ConnectOptions, Connection, ServerEvent};
use herald_proto::MessageView;
use herald_server::{Config, Server};
use herald_store::{EmbeddedEngine, StoreConfig};
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const API_KEY: &str = "test-api-key-0123456789";
pub const API_KEY_2: &str = "other-api-key-9876543210";
pub const JWT_SECRET: &str = "test-jwt-secret-0123456789abcdef0123456789";
/// Upper bound for any single wait in a test.
pub const WAIT: Duration = Duration::from_secs(20);

pub struct TestServer {
    pub addr: SocketAddr,
    pub url: String,
    pub state: Arc<herald_server::AppState>,
    pub engine: Arc<EmbeddedEngine>,
    pub data_dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    stop_tx: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
    http: reqwest::Client,
}

pub fn base_config() -> Config {
    let mut c = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        dev: true,
        api_keys: vec![API_KEY.into(), API_KEY_2.into()],
        ..Default::default()
    };
    c.jwt.hs256_secret = Some(JWT_SECRET.into());
    c
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(tweak: impl FnOnce(&mut Config)) -> Self {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = tmp.path().to_path_buf();
        let mut s = Self::start_in(dir, tweak).await;
        s._tmp = Some(tmp);
        s
    }

    pub async fn start_in(data_dir: PathBuf, tweak: impl FnOnce(&mut Config)) -> Self {
        let mut config = base_config();
        config.data_dir = data_dir.clone();
        tweak(&mut config);
        config.validate().expect("test config is valid");
        let engine = Arc::new(EmbeddedEngine::open(StoreConfig::new(&data_dir)).expect("open store"));
        let server = Server::bind(config, engine.clone()).await.expect("bind");
        let addr = server.local_addr();
        let state = server.state().clone();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async move {
            let _ = stop_rx.await;
        }));
        TestServer {
            addr,
            url: format!("http://{addr}"),
            state,
            engine,
            data_dir,
            _tmp: None,
            stop_tx: Some(stop_tx),
            task: Some(task),
            http: reqwest::Client::new(),
        }
    }

    /// Graceful stop; returns when the server has shut down.
    pub async fn stop(mut self) {
        self.stop_now().await;
    }

    pub async fn stop_now(&mut self) {
        if let Some(tx) = self.stop_tx.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(WAIT, task).await.expect("server stops in time").unwrap().unwrap();
        }
    }

    pub async fn connect(&self, user: &str) -> Connection {
        Connection::connect(&ConnectOptions::dev_user(&self.url, user)).await.expect("connect")
    }

    /// `POST /api/v1/channels/{channel}/messages` with the first API key.
    pub async fn publish(&self, channel: &str, data: Value) -> Resp {
        self.publish_with(channel, serde_json::json!({ "data": data }), None, Some(API_KEY)).await
    }

    pub async fn publish_with(
        &self,
        channel: &str,
        body: Value,
        key: Option<&str>,
        api_key: Option<&str>,
    ) -> Resp {
        let mut req = self.http.post(format!("{}/api/v1/channels/{channel}/messages", self.url)).json(&body);
        if let Some(k) = key {
            req = req.header("Idempotency-Key", k);
        }
        if let Some(a) = api_key {
            req = req.bearer_auth(a);
        }
        Resp::from(req.send().await.expect("http request")).await
    }

    pub async fn post_raw(&self, path: &str, body: Vec<u8>, headers: &[(&str, &str)]) -> Resp {
        let mut req = self.http.post(format!("{}{path}", self.url)).body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        Resp::from(req.send().await.expect("http request")).await
    }

    /// Any API call with the first API key, a JSON body and extra headers.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Resp {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("valid method");
        let mut req = self.http.request(method, format!("{}{path}", self.url)).bearer_auth(API_KEY);
        if let Some(b) = body {
            req = req.json(&b);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        Resp::from(req.send().await.expect("http request")).await
    }

    pub async fn get(&self, path: &str) -> Resp {
        let req = self.http.get(format!("{}{path}", self.url)).bearer_auth(API_KEY);
        Resp::from(req.send().await.expect("http request")).await
    }

    /// The channel's stored seqs (via the history API), ascending.
    pub async fn history(&self, channel: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut after = 0;
        loop {
            let r = self.get(&format!("/api/v1/channels/{channel}/messages?after={after}&limit=1000")).await;
            assert_eq!(r.status, 200, "{:?}", r.body);
            let msgs = r.body["messages"].as_array().unwrap().clone();
            if msgs.is_empty() {
                return out;
            }
            after = msgs.last().unwrap()["seq"].as_u64().unwrap();
            out.extend(msgs);
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop_tx.take() {
            let _ = tx.send(());
        }
    }
}

pub struct Resp {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Resp {
    async fn from(r: reqwest::Response) -> Self {
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let bytes = r.bytes().await.expect("body");
        let body =
            serde_json::from_slice(&bytes).unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()));
        Resp { status, headers, body }
    }

    pub fn code(&self) -> &str {
        self.body["code"].as_str().unwrap_or("")
    }

    pub fn is_problem(&self) -> bool {
        self.headers.get("content-type").and_then(|v| v.to_str().ok()) == Some("application/problem+json")
    }
}

/// The next text frame, with a deadline.
pub async fn next_frame(conn: &mut Connection) -> MessageView {
    match tokio::time::timeout(WAIT, conn.next_frame()).await.expect("frame in time").expect("read") {
        Some(ServerEvent::Frame(v)) => v,
        other => panic!("expected a frame, got {other:?}"),
    }
}

/// The next `message` frames, `n` of them, skipping nothing.
pub async fn next_messages(conn: &mut Connection, n: usize) -> Vec<MessageView> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let f = next_frame(conn).await;
        assert_eq!(f.kind, "message", "expected a message, got {f:?}");
        out.push(f);
    }
    out
}

/// Read until the socket closes; returns the frames before it and the close code.
pub async fn read_until_closed(conn: &mut Connection) -> (Vec<MessageView>, Option<u16>) {
    let mut frames = Vec::new();
    loop {
        match tokio::time::timeout(WAIT, conn.next_frame()).await.expect("close in time") {
            Ok(Some(ServerEvent::Frame(v))) => frames.push(v),
            Ok(Some(ServerEvent::Closed { code, .. })) => return (frames, code),
            Ok(None) => return (frames, None),
            Err(e) => panic!("read failed before close: {e}"),
        }
    }
}

/// Assert that no frame arrives within `d`.
pub async fn assert_silent(conn: &mut Connection, d: Duration) {
    if let Ok(r) = tokio::time::timeout(d, conn.next_frame()).await {
        panic!("expected silence, got {r:?}");
    }
}

/// Poll `f` until it returns true, or panic at the deadline.
pub async fn assert_eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}

pub fn seqs(msgs: &[MessageView]) -> Vec<u64> {
    msgs.iter().map(|m| m.seq.expect("durable message has a seq")).collect()
}
