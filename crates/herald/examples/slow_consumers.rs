//! Memory under slow consumers: starts `herald serve --dev` (the binary
//! given as the first argument), connects clients that subscribe and then
//! never read, publishes large messages to their channels, and prints the
//! server's resident memory before, at its peak and after, and how each
//! client ended. A program that prints figures, not a test.
//!
//! ```text
//! cargo build -p herald && cargo run -p herald --example slow_consumers -- target/debug/herald
//! ```
//!
//! Options after the binary: `--clients N` (4), `--messages N` per client
//! (1200), `--size BYTES` of each message's data (60000). Server settings
//! come from the environment as usual (`HERALD_CONFIG=file.toml`).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_client::{ConnectOptions, Connection, ServerEvent};

struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `VmRSS` and `VmHWM` (peak) of a process, in MiB.
fn memory(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn arg(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bin = args.first().cloned().unwrap_or_else(|| "target/debug/herald".into());
    let clients = arg(&args, "--clients", 4);
    let messages = arg(&args, "--messages", 1200);
    let size = arg(&args, "--size", 60_000);
    // `--no-subscribers`: publish the same, with nobody subscribed (the
    // server's memory without any queue).
    let subscribe = !args.iter().any(|a| a == "--no-subscribers");

    let dir = tempfile::tempdir()?;
    let mut child = Command::new(&bin)
        .args(["serve", "--dev", "--fsync", "never", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env("HERALD_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let served = Served(child);
    let pid = served.0.id();
    let banner = lines.next().expect("a banner line")?;
    eprintln!("{banner}");
    let url = banner.strip_prefix("herald listening on ").expect("the banner").trim().to_owned();
    std::thread::spawn(move || for _ in lines {});

    // Clients that subscribe, then never read; small receive buffers so the
    // kernel holds little of what the server sends them.
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse()?;
    let mut stuck = Vec::new();
    for i in (0..clients).filter(|_| subscribe) {
        let sock = tokio::net::TcpSocket::new_v4()?;
        sock.set_recv_buffer_size(4096)?;
        let stream = sock.connect(addr).await?;
        let mut c =
            Connection::connect_on(&ConnectOptions::dev_user(&url, format!("slow{i}")), stream).await?;
        c.subscribe(&format!("chat:slow{i}"), None).await?;
        stuck.push(c);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (before, _) = memory(pid);
    eprintln!("{clients} clients connected; publishing");

    let started = Instant::now();
    let http = reqwest::Client::new();
    let body = Arc::new(serde_json::json!({ "data": { "blob": "x".repeat(size) } }).to_string());
    let mut tasks = Vec::new();
    for i in 0..clients {
        let (http, body, url) = (http.clone(), body.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..messages {
                let r = http
                    .post(format!("{url}/api/v1/channels/chat:slow{i}/messages"))
                    .header("content-type", "application/json")
                    .body(body.as_str().to_owned())
                    .send()
                    .await
                    .expect("publish");
                assert_eq!(r.status().as_u16(), 201);
            }
        }));
    }
    // The queued-bytes gauge (servers that have it), sampled while publishing.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (http, url, done) = (http.clone(), url.clone(), done.clone());
        tokio::spawn(async move {
            let mut peak: Option<u64> = None;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(r) = http.get(format!("{url}/metrics")).send().await {
                    let text = r.text().await.unwrap_or_default();
                    let value = text.lines().find_map(|l| l.strip_prefix("herald_outbox_bytes "));
                    if let Some(v) = value.and_then(|v| v.trim().parse::<u64>().ok()) {
                        peak = Some(peak.unwrap_or(0).max(v));
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            peak
        })
    };
    for t in tasks {
        t.await?;
    }
    let published = started.elapsed();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let gauge_peak = sampler.await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (after, peak) = memory(pid);

    println!("server: {bin}");
    println!(
        "{clients} clients that never read, {messages} messages of {size} bytes each to their channels, published in {:.1} s",
        published.as_secs_f64()
    );
    println!("RSS before: {before:.1} MiB   peak: {peak:.1} MiB   2 s after publishing: {after:.1} MiB");
    if let Some(p) = gauge_peak {
        println!("herald_outbox_bytes peak (sampled every 20 ms): {:.1} MiB", p as f64 / 1048576.0);
    }
    for (i, c) in stuck.iter_mut().enumerate() {
        let mut got = 0usize;
        let end = loop {
            match tokio::time::timeout(Duration::from_secs(5), c.next_frame()).await {
                Ok(Ok(Some(ServerEvent::Frame(f)))) if f.kind == "message" => got += 1,
                Ok(Ok(Some(ServerEvent::Frame(_)))) => {}
                Ok(Ok(Some(ServerEvent::Closed { code, .. }))) => break format!("closed {code:?}"),
                Ok(Ok(None)) | Ok(Err(_)) => break "ended".to_owned(),
                Err(_) => break "still open".to_owned(),
            }
        };
        println!("client {i}: {got} messages read afterwards, then {end}");
    }
    Ok(())
}
