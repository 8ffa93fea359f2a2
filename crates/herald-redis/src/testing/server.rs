//! `redis-server` processes for tests: a single instance or a 3-master
//! cluster (with replicas if asked), each on a free port in a temp dir,
//! killed (SIGKILL) on drop.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const REDIS_SERVER: &str = "redis-server";
const REDIS_CLI: &str = "redis-cli";

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

/// `kill -SIG pid`; panics if it fails.
pub fn signal(pid: u32, sig: &str) {
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
