//! Test support: private `redis-server` processes (a single instance or a
//! 3-master cluster) on free ports in temp dirs, killed on drop; Herald
//! nodes (in-process servers on `127.0.0.1:0`) on a `RedisEngine` each; and
//! bounded waits. Never touches a shared Redis.
#![allow(dead_code)]

pub mod history;

use std::future::Future;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_client::{ConnectOptions, Connection, ServerEvent};
use herald_proto::MessageView;
use herald_redis::{RedisConfig, RedisEngine};
use herald_server::{Config, Server};
use serde_json::Value;
use tokio::net::TcpStream as TokioTcpStream;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// Upper bound for any single wait in a test.
pub const WAIT: Duration = Duration::from_secs(20);
pub const API_KEY: &str = "test-api-key-0123456789";

const REDIS_SERVER: &str = "redis-server";
const REDIS_CLI: &str = "redis-cli";

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HERALD_TEST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A port free now, with `port + 10000` free too (a cluster bus port).
fn free_port() -> u16 {
    for _ in 0..200 {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free port pair found");
}

/// One `redis-server` process. Killed (SIGKILL) on drop.
pub struct RedisServer {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    extra: Vec<String>,
}

impl RedisServer {
    /// A single instance with AOF, `appendfsync always`, no RDB snapshots.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Self {
        let mut last_err = String::new();
        for _ in 0..5 {
            let mut s = RedisServer {
                port: free_port(),
                dir: tempfile::tempdir().expect("temp dir"),
                child: None,
                extra: extra.iter().map(|s| s.to_string()).collect(),
            };
            match s.spawn() {
                Ok(()) => return s,
                Err(e) => last_err = e,
            }
        }
        panic!("redis-server did not start: {last_err}");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    fn spawn(&mut self) -> Result<(), String> {
        let log = std::fs::File::create(self.dir.path().join("redis.log")).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(REDIS_SERVER);
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "yes", "--appendfsync", "always", "--protected-mode", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        let child = cmd.spawn().map_err(|e| format!("cannot run {REDIS_SERVER} ({e}); install it (apt-get install redis-server) or run scripts/test"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    self.child = None;
                    let log = std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
                    return Err(format!("exited with {status}: {log}"));
                }
            }
            if ping(self.port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err("no PONG within 10s".into())
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start again on the same port and dir (AOF replayed).
    pub fn restart(&mut self) {
        self.kill9();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => panic!("redis-server did not restart: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Kill, delete every data file, start again empty on the same port.
    pub fn restart_empty(&mut self) {
        self.kill9();
        for entry in std::fs::read_dir(self.dir.path()).expect("read dir").flatten() {
            let p = entry.path();
            if p.file_name().is_some_and(|n| n != "redis.log") {
                if p.is_dir() {
                    let _ = std::fs::remove_dir_all(&p);
                } else {
                    let _ = std::fs::remove_file(&p);
                }
            }
        }
        self.restart();
    }

    pub fn sigstop(&self) {
        signal(self.pid(), "STOP");
    }

    pub fn sigcont(&self) {
        signal(self.pid(), "CONT");
    }

    /// `redis-cli -p PORT args...`, stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_ref() {
            // A stopped process must be continued to die promptly.
            signal(c.id(), "CONT");
        }
        self.kill9();
    }
}

fn signal(pid: u32, sig: &str) {
    let ok =
        Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status().is_ok_and(|s| s.success());
    assert!(ok, "kill -{sig} {pid} failed");
}

pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new(REDIS_CLI)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ping(port: u16) -> bool {
    let Ok(mut s) =
        TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_millis(200))
    else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(s.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG"))
}

/// Three masters, no replicas.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        Self::start_with_replicas(0)
    }

    /// Three masters with `replicas` replicas each (node timeout 2 s: a
    /// master that dies is replaced by its replica within a few seconds).
    pub fn start_with_replicas(replicas: usize) -> Self {
        let extra = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
        ];
        let nodes: Vec<RedisServer> =
            (0..3 * (1 + replicas)).map(|_| RedisServer::start_with(&extra)).collect();
        let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let out = Command::new(REDIS_CLI)
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string()])
            .arg("--cluster-yes")
            .output()
            .expect("run redis-cli --cluster create");
        assert!(out.status.success(), "cluster create failed: {}", String::from_utf8_lossy(&out.stdout));
        let deadline = Instant::now() + Duration::from_secs(20);
        for n in &nodes {
            while !n.cli(&["cluster", "info"]).contains("cluster_state:ok") {
                assert!(Instant::now() < deadline, "cluster did not become ok");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // Every node must know every slot's owner before clients route.
        for n in &nodes {
            while n.cli(&["cluster", "slots"]).lines().filter(|l| l.trim() == "127.0.0.1").count() < 3 {
                assert!(Instant::now() < deadline, "cluster slots not propagated");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        if replicas > 0 {
            // Every replica has synced with its master.
            for n in &nodes {
                loop {
                    let info = n.cli(&["info", "replication"]);
                    if info.contains("role:master") || info.contains("master_link_status:up") {
                        break;
                    }
                    assert!(Instant::now() < deadline, "replica did not sync: {info}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        RedisCluster { nodes }
    }

    /// The index in `nodes` of the master serving `hash_tag`'s slot, as
    /// `nodes[from]` sees it.
    pub fn master_of(&self, hash_tag: &str, from: usize) -> Option<usize> {
        let slot: u16 = self.nodes[from].cli(&["cluster", "keyslot", hash_tag]).trim().parse().ok()?;
        let table = self.nodes[from].cli(&["cluster", "nodes"]);
        for line in table.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 9 || !f[2].contains("master") || f[2].contains("fail") {
                continue;
            }
            let serves = f[8..].iter().any(|r| match r.split_once('-') {
                Some((lo, hi)) => {
                    lo.parse::<u16>().is_ok_and(|lo| lo <= slot)
                        && hi.parse::<u16>().is_ok_and(|hi| slot <= hi)
                }
                None => r.parse::<u16>() == Ok(slot),
            });
            if serves {
                let port: u16 = f[1].split(['@', ':']).nth(1)?.parse().ok()?;
                return self.nodes.iter().position(|n| n.port == port);
            }
        }
        None
    }

    /// The comma-separated seed list.
    pub fn url(&self) -> String {
        self.nodes.iter().map(RedisServer::url).collect::<Vec<_>>().join(",")
    }
}

/// Engine settings for tests: short checks so lost messages show quickly.
pub fn engine_config(url: &str) -> RedisConfig {
    let mut c = RedisConfig::new(url);
    c.head_check_interval = Duration::from_millis(200);
    c.command_timeout = Duration::from_secs(2);
    c.lease_ttl = Duration::from_secs(2);
    c
}

pub async fn engine(url: &str) -> Arc<RedisEngine> {
    Arc::new(RedisEngine::open(engine_config(url)).await.expect("open redis engine"))
}

/// An engine under a key prefix of its own (`herald-f<n>`), for a
/// conformance fixture: `presence_expire` sweeps every channel of the
/// prefix, so the expiry scenarios need an index no other fixture on the
/// same Redis sweeps.
pub async fn fixture_engine(url: &str) -> Arc<RedisEngine> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut config = engine_config(url);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    config.key_prefix = format!("herald-f{}-{n}", std::process::id());
    Arc::new(RedisEngine::open(config).await.expect("open redis engine"))
}

/// Poll `f` until it returns `Some`, at most `WAIT`.
pub async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A Herald node: an in-process server on `127.0.0.1:0` with its own
/// `RedisEngine`.
pub struct Node {
    pub addr: SocketAddr,
    pub url: String,
    pub engine: Arc<RedisEngine>,
    pub state: Arc<herald_server::AppState>,
    stop_tx: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
    http: reqwest::Client,
}

pub fn base_config() -> Config {
    Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        dev: true,
        api_keys: vec![API_KEY.into()],
        ..Default::default()
    }
}

impl Node {
    pub async fn start(redis_url: &str) -> Self {
        Self::start_with(engine_config(redis_url), |_| {}).await
    }

    pub async fn start_with(engine_config: RedisConfig, tweak: impl FnOnce(&mut Config)) -> Self {
        let mut config = base_config();
        tweak(&mut config);
        config.validate().expect("valid test config");
        let engine = Arc::new(RedisEngine::open(engine_config).await.expect("open redis engine"));
        let server = Server::bind(config, engine.clone()).await.expect("bind");
        let addr = server.local_addr();
        let state = server.state().clone();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async move {
            let _ = stop_rx.await;
        }));
        Node {
            addr,
            url: format!("http://{addr}"),
            engine,
            state,
            stop_tx: Some(stop_tx),
            task: Some(task),
            http: reqwest::Client::new(),
        }
    }

    /// Graceful stop.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop_tx.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(WAIT, task).await.expect("node stops in time").unwrap().unwrap();
        }
    }

    /// Drop the node without a graceful shutdown: the server task is
    /// aborted (its sockets close), the engine's tasks stop.
    pub fn kill(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    pub async fn connect(&self, user: &str) -> Connection {
        Connection::connect(&ConnectOptions::dev_user(&self.url, user)).await.expect("connect")
    }

    /// `POST /api/v1/channels/{channel}/messages`.
    pub async fn publish(&self, channel: &str, data: Value, key: Option<&str>) -> (u16, Value) {
        let mut req = self
            .http
            .post(format!("{}/api/v1/channels/{channel}/messages", self.url))
            .bearer_auth(API_KEY)
            .timeout(WAIT)
            .json(&serde_json::json!({ "data": data }));
        if let Some(k) = key {
            req = req.header("Idempotency-Key", k);
        }
        let r = req.send().await.expect("http request");
        let status = r.status().as_u16();
        let body = r.json().await.unwrap_or(Value::Null);
        (status, body)
    }

    /// Any API request; `(status, body)`.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut req =
            self.http.request(method, format!("{}{path}", self.url)).bearer_auth(API_KEY).timeout(WAIT);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.expect("http request");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self.http.get(format!("{}{path}", self.url)).bearer_auth(API_KEY).timeout(WAIT).send().await;
        let r = r.expect("http request");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Every stored message of `channel` (history API), ascending.
    pub async fn history(&self, channel: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut after = 0;
        loop {
            let path = format!("/api/v1/channels/{channel}/messages?after={after}&limit=1000");
            // Redis may still be coming back: a 503 is retried.
            let body = eventually("a history page", || async {
                let (status, body) = self.get(&path).await;
                assert!(status == 200 || status == 503, "{status} {body}");
                (status == 200).then_some(body)
            })
            .await;
            let msgs = body["messages"].as_array().expect("messages").clone();
            let Some(last) = msgs.last() else { return out };
            after = last["seq"].as_u64().expect("seq");
            out.extend(msgs);
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(tx) = self.stop_tx.take() {
            let _ = tx.send(());
        }
    }
}

/// The next server event with a deadline; `None` when the socket closed.
pub async fn next_event(conn: &mut Connection) -> Option<ServerEvent> {
    tokio::time::timeout(WAIT, conn.next_frame()).await.expect("frame in time").expect("read")
}

/// The next `message` frame, skipping nothing else but pongs.
pub async fn next_message(conn: &mut Connection) -> MessageView {
    loop {
        match next_event(conn).await {
            Some(ServerEvent::Frame(v)) if v.kind == "message" => return v,
            Some(ServerEvent::Frame(v)) if v.kind == "pong" => continue,
            other => panic!("expected a message, got {other:?}"),
        }
    }
}

/// The JSON `data` of a message frame.
pub fn data(v: &MessageView) -> Value {
    serde_json::from_str(v.data.as_ref().expect("data").get()).expect("data is JSON")
}

/// Server settings for presence tests: leases of `ttl` (renewed every
/// third of it), swept every 100 ms.
pub fn presence_config(ttl: Duration) -> impl FnOnce(&mut Config) + Send + 'static {
    move |c: &mut Config| {
        c.presence.member_lease_ttl = ttl;
        c.presence.sweep_interval = Duration::from_millis(100);
    }
}

/// A Herald node in a runtime of its own, so it can die the way a process
/// does: [`crash`](CrashableNode::crash) drops every task of it at once
/// (sessions, keeper, the engine's connections and lease), and no cleanup
/// reaches Redis. Its clients see their sockets close.
pub struct CrashableNode {
    pub node: Option<Node>,
    rt: Option<tokio::runtime::Runtime>,
}

impl CrashableNode {
    pub async fn start_with(
        engine_config: RedisConfig,
        tweak: impl FnOnce(&mut Config) + Send + 'static,
    ) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("node runtime");
        let node = rt.spawn(Node::start_with(engine_config, tweak)).await.expect("node starts");
        CrashableNode { node: Some(node), rt: Some(rt) }
    }

    pub fn node(&self) -> &Node {
        self.node.as_ref().expect("not crashed")
    }

    /// Stop the node's runtime without running anything more on it.
    pub fn crash(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
        self.node = None;
    }
}

impl Drop for CrashableNode {
    fn drop(&mut self) {
        // A runtime cannot be dropped (it blocks) inside the test's runtime.
        self.crash();
    }
}

/// A TCP proxy in front of a Redis, that can cut a node off from it: while
/// cut, its connections are closed and new ones are closed at once.
pub struct RedisProxy {
    pub port: u16,
    cut_tx: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl RedisProxy {
    pub async fn start(target_port: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let (cut_tx, _) = watch::channel(false);
        let cut = cut_tx.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else { continue };
                if *cut.borrow() {
                    continue; // dropped: closed at once
                }
                let mut cut_rx = cut.subscribe();
                conns.spawn(async move {
                    let Ok(mut outbound) = TokioTcpStream::connect(("127.0.0.1", target_port)).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        () = until_cut(&mut cut_rx) => {}
                    }
                });
                while conns.try_join_next().is_some() {}
            }
        });
        RedisProxy { port, cut_tx, task }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn cut(&self) {
        self.cut_tx.send_replace(true);
    }

    pub fn restore(&self) {
        self.cut_tx.send_replace(false);
    }
}

async fn until_cut(rx: &mut watch::Receiver<bool>) {
    // The sender lives as long as the proxy: an error means it is gone.
    let _ = rx.wait_for(|cut| *cut).await;
}

impl Drop for RedisProxy {
    fn drop(&mut self) {
        // Dropping the accept task drops its JoinSet: every connection ends.
        self.task.abort();
    }
}

/// Subscribe to a presence channel as member `client_id`; the `ok` reply.
pub async fn join(conn: &mut Connection, channel: &str, client_id: &str) -> MessageView {
    let ok = conn
        .request(serde_json::json!({ "type": "subscribe", "channel": channel, "client_id": client_id }))
        .await
        .expect("subscribe");
    assert_eq!(ok.kind, "ok", "{ok:?}");
    ok
}

/// Keep reading `conn` in the background (which answers the server's
/// pings, as every WebSocket client does) until it closes or the handle is
/// aborted.
pub fn keep_reading(mut conn: Connection) -> JoinHandle<()> {
    tokio::spawn(async move { while let Ok(Some(_)) = conn.next_frame().await {} })
}

/// The next frame of any type but `pong`.
pub async fn next_frame(conn: &mut Connection) -> MessageView {
    loop {
        match next_event(conn).await {
            Some(ServerEvent::Frame(v)) if v.kind == "pong" => continue,
            Some(ServerEvent::Frame(v)) => return v,
            other => panic!("expected a frame, got {other:?}"),
        }
    }
}

/// The next `join` or `leave`, skipping other frames: `(kind, user, client id)`.
pub async fn next_presence(conn: &mut Connection) -> (String, String, String) {
    loop {
        let f = next_frame(conn).await;
        if f.kind == "join" || f.kind == "leave" {
            let m = f.member.expect("presence frames carry the member");
            return (f.kind, m.user, m.client_id);
        }
    }
}

/// The data of the next `room` event, skipping other frames.
pub async fn next_room_event(conn: &mut Connection) -> Value {
    loop {
        let f = next_frame(conn).await;
        if f.kind == "room" {
            return data(&f);
        }
    }
}

/// `PUT /api/v1/rooms/{room}` with `host` and `grace_period` (seconds).
pub async fn create_room(node: &Node, room: &str, host: &str, grace_secs: u64) -> Value {
    let body = serde_json::json!({ "host": host, "grace_period": grace_secs });
    let (status, body) = node.call("PUT", &format!("/api/v1/rooms/{room}"), Some(body), &[]).await;
    assert_eq!(status, 201, "{body}");
    body
}
