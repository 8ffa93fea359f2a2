//! Support of the Redis fault suite (`redis_under_faults.rs`): Herald nodes
//! as real `herald` processes (so they can be SIGSTOPped, and run inside a
//! network namespace: [`spawn_herald`]), a network namespace with veth pairs whose Redis link
//! can be cut (packets silently dropped), a client-side proxy that can go
//! silent, and the clients (`clients.rs`) that feed the history checker
//! (`herald_test_support::history`).
#![allow(dead_code)]

pub mod clients;

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use herald_test_support::{HeraldProcess, API_KEY};

/// How a node is started.
pub struct NodeOpts {
    pub redis_url: String,
    /// `IP:0` (the port is chosen by the OS and read from stdout).
    pub listen: String,
    /// Run inside this network namespace (`ip netns exec`).
    pub netns: Option<String>,
    pub presence_ttl: Duration,
}

impl NodeOpts {
    pub fn new(redis_url: &str) -> Self {
        Self {
            redis_url: redis_url.to_owned(),
            listen: "127.0.0.1:0".into(),
            netns: None,
            presence_ttl: Duration::from_secs(3),
        }
    }
}

/// A `herald serve` process on the Redis engine, its config and log in a
/// temp dir. Namespaces `chat` (durable) and `pres` (durable, presence);
/// the Redis settings are the defaults (command timeout 2 s, head checks
/// every second), so what the suite measures is what production gets.
pub fn spawn_herald(opts: NodeOpts) -> HeraldProcess {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = format!(
        r#"engine = "redis"
redis_url = "{url}"
dev = true
api_keys = ["{key}"]

[presence]
lease_ttl = "{ttl}ms"
sweep_interval = "200ms"

[namespaces.chat]
delivery = "durable"

[namespaces.pres]
delivery = "durable"
presence = true
"#,
        url = opts.redis_url,
        key = API_KEY,
        ttl = opts.presence_ttl.as_millis(),
    );
    let config_path = dir.path().join("herald.toml");
    std::fs::write(&config_path, config).expect("write config");
    let log = std::fs::File::create(HeraldProcess::log_path(&dir)).expect("log file");
    let bin = env!("CARGO_BIN_EXE_herald");
    let mut cmd = match &opts.netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, bin]);
            c
        }
        None => Command::new(bin),
    };
    cmd.args(["serve", "--config"])
        .arg(&config_path)
        .args(["--listen", &opts.listen])
        .env("HERALD_LOG", "info,herald_redis=debug")
        .stderr(log);
    HeraldProcess::spawn(&mut cmd, Some(dir))
}

fn run(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| format!("{}: {e}", args[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("`{}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Why a network partition cannot be made here, if it cannot.
pub fn netns_unavailable() -> Option<String> {
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    if uid.as_deref() != Some("0") {
        return Some("not root (network namespaces need root)".into());
    }
    if let Err(e) = run(&["ip", "netns", "list"]) {
        return Some(format!("`ip netns` unavailable: {e}"));
    }
    None
}

/// A network namespace for one node, reaching Redis through a router
/// namespace, and clients directly:
///
/// ```text
///  node ns  10.213.K.2 ──veth── 10.213.K.1  router ns  10.213.K.10 ──veth── 10.213.K.9  host (Redis)
///  node ns  10.213.K.6 ──veth── 10.213.K.5  host (clients)
/// ```
///
/// [`partition`](Netns::partition) makes the router drop everything between
/// the node and Redis (blackhole routes), without an error or an ICMP
/// message, as a network that loses packets does. The loss is neither on
/// the node's own link (a local drop makes Linux retry every 500 ms instead
/// of backing off) nor announced by ICMP (which makes Linux undo its
/// backoff), so the node's TCP connections back off as they would behind a
/// switch that drops everything. Removed on drop.
pub struct Netns {
    pub name: String,
    router: String,
    k: u32,
}

static NEXT_NET: AtomicU32 = AtomicU32::new(0);

impl Netns {
    pub fn create() -> Result<Self, String> {
        clean_stale();
        let pid = std::process::id();
        let mut last = String::new();
        for _ in 0..20 {
            let k = (pid.wrapping_mul(7) + NEXT_NET.fetch_add(1, Ordering::Relaxed)) % 250 + 1;
            let ns = Netns {
                name: format!("herald-faults-{pid}-{k}"),
                router: format!("herald-faults-{pid}-{k}-r"),
                k,
            };
            match ns.setup() {
                Ok(()) => return Ok(ns),
                Err(e) => last = e, // taken by another run: drop cleans ours up
            }
        }
        Err(last)
    }

    fn ifname(&self, which: &str) -> String {
        format!("hf{}{which}", self.k)
    }

    fn ip(&self, last: u8) -> String {
        format!("10.213.{}.{last}", self.k)
    }

    fn setup(&self) -> Result<(), String> {
        let (node, router) = (self.name.as_str(), self.router.as_str());
        let in_ns = |ns: &str, args: &[&str]| {
            let mut all = vec!["ip", "netns", "exec", ns];
            all.extend_from_slice(args);
            run(&all)
        };
        run(&["ip", "netns", "add", node])?;
        run(&["ip", "netns", "add", router])?;
        // node ↔ router
        let (n, r) = (self.ifname("n"), self.ifname("N"));
        run(&["ip", "link", "add", &n, "type", "veth", "peer", "name", &r])?;
        run(&["ip", "link", "set", &n, "netns", node])?;
        run(&["ip", "link", "set", &r, "netns", router])?;
        in_ns(node, &["ip", "addr", "add", &format!("{}/30", self.ip(2)), "dev", &n])?;
        in_ns(router, &["ip", "addr", "add", &format!("{}/30", self.ip(1)), "dev", &r])?;
        // router ↔ host (Redis)
        let (h, rr) = (self.ifname("r"), self.ifname("R"));
        run(&["ip", "link", "add", &h, "type", "veth", "peer", "name", &rr])?;
        run(&["ip", "link", "set", &rr, "netns", router])?;
        run(&["ip", "addr", "add", &format!("{}/30", self.ip(9)), "dev", &h])?;
        in_ns(router, &["ip", "addr", "add", &format!("{}/30", self.ip(10)), "dev", &rr])?;
        // node ↔ host (clients)
        let (c, cc) = (self.ifname("c"), self.ifname("C"));
        run(&["ip", "link", "add", &c, "type", "veth", "peer", "name", &cc])?;
        run(&["ip", "link", "set", &cc, "netns", node])?;
        run(&["ip", "addr", "add", &format!("{}/30", self.ip(5)), "dev", &c])?;
        in_ns(node, &["ip", "addr", "add", &format!("{}/30", self.ip(6)), "dev", &cc])?;
        for (ns, ifs) in
            [(node, vec!["lo", n.as_str(), cc.as_str()]), (router, vec!["lo", r.as_str(), rr.as_str()])]
        {
            for i in ifs {
                in_ns(ns, &["ip", "link", "set", i, "up"])?;
            }
        }
        run(&["ip", "link", "set", &h, "up"])?;
        run(&["ip", "link", "set", &c, "up"])?;
        // Per namespace; no `sysctl` binary needed.
        in_ns(router, &["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"])?;
        in_ns(node, &["ip", "route", "add", &format!("{}/30", self.ip(8)), "via", &self.ip(1)])?;
        // Back to the node, for Redis's replies (gone with the link).
        run(&["ip", "route", "add", &format!("{}/30", self.ip(0)), "via", &self.ip(10), "dev", &h])?;
        Ok(())
    }

    /// Where Redis listens for the namespace (the host end of the router's
    /// link).
    pub fn redis_ip(&self) -> String {
        self.ip(9)
    }

    /// Where the node in the namespace listens for clients.
    pub fn node_ip(&self) -> String {
        self.ip(6)
    }

    /// Cut the node off from Redis: the router drops what passes either
    /// way (blackhole routes: no error, no ICMP).
    pub fn partition(&self) {
        for net in [self.ip(8), self.ip(0)] {
            self.in_router(&["ip", "route", "replace", "blackhole", &format!("{net}/30")])
                .expect("blackhole");
        }
    }

    pub fn heal(&self) {
        for (net, dev, src) in
            [(self.ip(8), self.ifname("R"), self.ip(10)), (self.ip(0), self.ifname("N"), self.ip(1))]
        {
            let net = format!("{net}/30");
            self.in_router(&[
                "ip", "route", "replace", &net, "dev", &dev, "proto", "kernel", "scope", "link", "src", &src,
            ])
            .expect("route back");
        }
    }

    fn in_router(&self, args: &[&str]) -> Result<(), String> {
        let mut all = vec!["ip", "netns", "exec", self.router.as_str()];
        all.extend_from_slice(args);
        run(&all)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting a namespace deletes its veth ends, and with them the
        // host ends (and the route through them).
        let _ = run(&["ip", "netns", "del", &self.name]);
        let _ = run(&["ip", "netns", "del", &self.router]);
        for which in ["r", "c"] {
            let _ = run(&["ip", "link", "del", &self.ifname(which)]);
        }
    }
}

/// Remove the namespaces of suite runs that died without cleaning up.
fn clean_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else { return };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix("herald-faults-") else { continue };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run(&["ip", "netns", "del", name]);
        }
    }
}

/// A TCP proxy (clients → a node) that can go silent: after
/// [`freeze`](SilentProxy::freeze) nothing more passes either way and both
/// sockets stay open, as when a client's network dies without a reset.
pub struct SilentProxy {
    pub port: u16,
    frozen: watch::Sender<bool>,
    task: JoinHandle<()>,
}

type Kept = Arc<Mutex<Vec<(tokio::net::TcpStream, tokio::net::TcpStream)>>>;

impl SilentProxy {
    pub async fn start(target: std::net::SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let (frozen, _) = watch::channel(false);
        let f = frozen.clone();
        let kept: Kept = Arc::default();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else { continue };
                let (mut rx, kept) = (f.subscribe(), kept.clone());
                conns.spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = rx.wait_for(|f| *f) => {
                            kept.lock().unwrap_or_else(|e| e.into_inner()).push((inbound, outbound));
                        }
                    }
                });
                while conns.try_join_next().is_some() {}
            }
        });
        SilentProxy { port, frozen, task }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }
}

impl Drop for SilentProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Poll `f` every 20 ms until it holds or `limit` passes; returns how long
/// it took, or `None`.
pub async fn within<F, Fut>(limit: Duration, mut f: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if f().await {
            return Some(start.elapsed());
        }
        if start.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
