//! The server harness: a real Herald server in this process on
//! `127.0.0.1:0`, over any engine, with HTTP helpers. Every wait is
//! bounded ([`WAIT`]).
//!
//! Everything this crate knows of herald-server is here: [`Config`] and the
//! fields [`base_config`] sets, and [`Server`]'s `bind`, `local_addr`,
//! `state` and `run`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use herald_client::{ConnectOptions, Connection};
use herald_core::conformance::{eventually, WAIT};
use herald_core::Engine;
use herald_server::{AppState, Config, Server};
use herald_store::{EmbeddedEngine, StoreConfig};
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const API_KEY: &str = "test-api-key-0123456789";
pub const API_KEY_2: &str = "other-api-key-9876543210";
pub const JWT_SECRET: &str = "test-jwt-secret-0123456789abcdef0123456789";

/// What every harness server starts from: `127.0.0.1:0`, dev mode (dev
/// users connect without a token), [`API_KEY`] and [`API_KEY_2`], HS256
/// tokens signed with [`JWT_SECRET`].
pub fn base_config() -> Config {
    let mut c = Config {
        listen: "127.0.0.1:0".parse().expect("an address"),
        dev: true,
        api_keys: vec![API_KEY.into(), API_KEY_2.into()],
        ..Default::default()
    };
    c.jwt.hs256_secret = Some(JWT_SECRET.into());
    // Stopping closes every session at once, as a test expects; drain
    // tests set a period.
    c.shutdown.drain_period = std::time::Duration::ZERO;
    c
}

/// A running server over engine `E`: the embedded engine in a temp dir
/// ([`TestServer::start`]) or a Redis node ([`Node`](crate::Node)). It
/// stops (without waiting) when dropped.
pub struct TestServer<E = EmbeddedEngine> {
    pub addr: SocketAddr,
    /// `http://{addr}`.
    pub url: String,
    pub state: Arc<AppState>,
    pub engine: Arc<E>,
    pub data_dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    stop_tx: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
    http: reqwest::Client,
}

impl TestServer<EmbeddedEngine> {
    /// [`base_config`] with the embedded engine in a temp dir.
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

    /// The embedded engine in `data_dir` (kept after the server stops: a
    /// restart test starts another server in it).
    pub async fn start_in(data_dir: PathBuf, tweak: impl FnOnce(&mut Config)) -> Self {
        let mut config = base_config();
        config.data_dir = data_dir.clone();
        tweak(&mut config);
        let engine = Arc::new(EmbeddedEngine::open(StoreConfig::new(&data_dir)).expect("open store"));
        Self::serve(config, engine).await
    }
}

impl<E: Engine + 'static> TestServer<E> {
    /// Validate `config`, bind and run a server over `engine`.
    pub async fn serve(config: Config, engine: Arc<E>) -> Self {
        config.validate().expect("test config is valid");
        let data_dir = config.data_dir.clone();
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

    /// Drop the server without a graceful shutdown: its task is aborted
    /// (its sockets close), the engine's tasks stop with the engine.
    pub fn kill(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// A WebSocket connection as dev user `user`.
    pub async fn connect(&self, user: &str) -> Connection {
        Connection::connect(&ConnectOptions::dev_user(&self.url, user)).await.expect("connect")
    }

    /// `POST /api/v1/channels/{channel}/messages` with [`API_KEY`].
    pub async fn publish(&self, channel: &str, data: Value) -> Resp {
        self.publish_with(channel, serde_json::json!({ "data": data }), None, Some(API_KEY)).await
    }

    /// A publish with the whole `body`, an `Idempotency-Key` and an API key
    /// of the caller's choice.
    pub async fn publish_with(
        &self,
        channel: &str,
        body: Value,
        key: Option<&str>,
        api_key: Option<&str>,
    ) -> Resp {
        let channel = herald_client::encode_path_segment(channel);
        let mut req = self.http.post(format!("{}/api/v1/channels/{channel}/messages", self.url)).json(&body);
        if let Some(k) = key {
            req = req.header("Idempotency-Key", k);
        }
        if let Some(a) = api_key {
            req = req.bearer_auth(a);
        }
        Resp::from(req).await
    }

    pub async fn post_raw(&self, path: &str, body: Vec<u8>, headers: &[(&str, &str)]) -> Resp {
        let mut req = self.http.post(format!("{}{path}", self.url)).body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        Resp::from(req).await
    }

    /// Any API call with [`API_KEY`], a JSON body and extra headers.
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
        Resp::from(req).await
    }

    pub async fn get(&self, path: &str) -> Resp {
        Resp::from(self.http.get(format!("{}{path}", self.url)).bearer_auth(API_KEY)).await
    }

    /// Every stored message of `channel` (the history API), ascending. A
    /// 503 (the engine unavailable: Redis coming back) is retried.
    pub async fn history(&self, channel: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut after = 0;
        let channel = herald_client::encode_path_segment(channel);
        loop {
            let path = format!("/api/v1/channels/{channel}/messages?after={after}&limit=1000");
            let body = eventually("a history page", || async {
                let r = self.get(&path).await;
                assert!(r.status == 200 || r.status == 503, "{} {:?}", r.status, r.body);
                (r.status == 200).then_some(r.body)
            })
            .await;
            let msgs = body["messages"].as_array().expect("messages").clone();
            let Some(last) = msgs.last() else { return out };
            after = last["seq"].as_u64().expect("seq");
            out.extend(msgs);
        }
    }
}

impl<E> Drop for TestServer<E> {
    fn drop(&mut self) {
        if let Some(tx) = self.stop_tx.take() {
            let _ = tx.send(());
        }
    }
}

/// An HTTP response: status, headers and the body as JSON (a body that is
/// not JSON is a JSON string).
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Resp {
    /// Send `req` (bounded by [`WAIT`]) and read the whole response.
    async fn from(req: reqwest::RequestBuilder) -> Self {
        let r = req.timeout(WAIT).send().await.expect("http request");
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let bytes = r.bytes().await.expect("body");
        let body =
            serde_json::from_slice(&bytes).unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()));
        Resp { status, headers, body }
    }

    /// The problem's `code`, or `""`.
    pub fn code(&self) -> &str {
        self.body["code"].as_str().unwrap_or("")
    }

    pub fn is_problem(&self) -> bool {
        self.headers.get("content-type").and_then(|v| v.to_str().ok()) == Some("application/problem+json")
    }
}
