//! A webhook backend for tests: a real HTTP/1.1 server on 127.0.0.1 that
//! records every request (body, signature check, fencing token) and answers
//! as its current mode says: 200, 500, never (a timeout), slowly, by
//! closing the connection, or not at all (`refuse`: the port is closed and
//! connections are refused until `accept_again`).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hmac::{Hmac, Mac};
use serde::Deserialize;
use serde_json::value::RawValue;
use sha2::Sha256;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    Ok = 0,
    Fail500 = 1,
    /// Read the request, never answer (the sender times out).
    Hang = 2,
    /// Answer 200 after 300 ms.
    Slow = 3,
    /// Close the connection without an answer.
    Close = 4,
}

#[derive(Debug, Deserialize)]
pub struct Body {
    pub webhook: String,
    pub channel: String,
    pub epoch: String,
    pub messages: Vec<Msg>,
}

#[derive(Debug, Deserialize)]
pub struct Msg {
    #[serde(rename = "type")]
    pub kind: String,
    pub seq: u64,
    pub id: String,
    pub ts: u64,
    pub data: Box<RawValue>,
}

/// One request as the backend saw it.
#[derive(Debug)]
pub struct Seen {
    pub body: Body,
    pub accepted: bool,
    pub signature_ok: bool,
    pub webhook_id: String,
    pub token: u64,
    pub content_type: String,
}

impl Seen {
    pub fn seqs(&self) -> Vec<u64> {
        self.body.messages.iter().map(|m| m.seq).collect()
    }
}

pub struct Backend {
    pub addr: SocketAddr,
    pub url: String,
    secret: Vec<u8>,
    mode: Arc<AtomicU8>,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Rejects (500) requests holding a message whose data contains this.
    poison: Arc<Mutex<Option<String>>>,
    accept: Mutex<Option<JoinHandle<()>>>,
    in_flight: AtomicUsize,
    /// The most requests that were being answered at once.
    pub max_in_flight: AtomicUsize,
}

impl Backend {
    pub async fn start(secret: &str) -> Arc<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind backend");
        let addr = listener.local_addr().unwrap();
        let b = Arc::new(Backend {
            addr,
            url: format!("http://{addr}/hook"),
            secret: secret.as_bytes().to_vec(),
            mode: Arc::new(AtomicU8::new(Mode::Ok as u8)),
            seen: Arc::default(),
            poison: Arc::default(),
            accept: Mutex::new(None),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
        });
        b.serve(listener);
        b
    }

    fn serve(self: &Arc<Self>, listener: TcpListener) {
        let me = self.clone();
        let task = tokio::spawn(async move {
            // Connections die with the accept task (`refuse`).
            let mut conns = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    Ok((s, _)) = listener.accept() => { conns.spawn(me.clone().conn(s)); }
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
        });
        *self.accept.lock().unwrap() = Some(task);
    }

    pub fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }

    pub fn poison(&self, marker: Option<&str>) {
        *self.poison.lock().unwrap() = marker.map(str::to_owned);
    }

    /// Close the port (and every open connection): connections are refused.
    pub fn refuse(&self) {
        if let Some(t) = self.accept.lock().unwrap().take() {
            t.abort();
        }
    }

    pub async fn accept_again(self: &Arc<Self>) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => return self.serve(l),
                Err(e) => {
                    assert!(std::time::Instant::now() < deadline, "rebind {}: {e}", self.addr);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    pub fn with_seen<T>(&self, f: impl FnOnce(&[Seen]) -> T) -> T {
        f(&self.seen.lock().unwrap())
    }

    /// Per channel, the seqs of accepted requests in arrival order.
    pub fn accepted(&self, channel: &str) -> Vec<Vec<u64>> {
        self.with_seen(|s| {
            s.iter().filter(|r| r.accepted && r.body.channel == channel).map(Seen::seqs).collect()
        })
    }

    async fn conn(self: Arc<Self>, mut s: TcpStream) {
        let mut buf = Vec::new();
        loop {
            let Some((head, body)) = read_request(&mut s, &mut buf).await else { return };
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_in_flight.fetch_max(now, Ordering::SeqCst);
            let answered = self.answer(&mut s, &head, &body).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            if !answered {
                return;
            }
        }
    }

    /// Record and answer one request; `false`: the connection is done.
    async fn answer(&self, s: &mut TcpStream, head: &str, body: &[u8]) -> bool {
        {
            let mode = self.mode.load(Ordering::SeqCst);
            let header = |name: &str| {
                head.lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
                    })
                    .unwrap_or_default()
            };
            let signature_ok = verify(&self.secret, &header("herald-signature"), body);
            let parsed: Body = serde_json::from_slice(body).expect("webhook body parses");
            let poisoned = self
                .poison
                .lock()
                .unwrap()
                .as_deref()
                .is_some_and(|p| parsed.messages.iter().any(|m| m.data.get().contains(p)));
            let accepted = !poisoned && (mode == Mode::Ok as u8 || mode == Mode::Slow as u8);
            // Accepted once the 200 is written (an answer cut off by
            // `refuse` is a failure the sender retries).
            let idx = {
                let mut seen = self.seen.lock().unwrap();
                seen.push(Seen {
                    body: parsed,
                    accepted: false,
                    signature_ok,
                    webhook_id: header("herald-webhook-id"),
                    token: header("herald-fencing-token").parse().unwrap_or(0),
                    content_type: header("content-type"),
                });
                seen.len() - 1
            };
            let reply: &[u8] = if accepted {
                b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
            } else {
                b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n"
            };
            match mode {
                _ if poisoned => {}
                m if m == Mode::Hang as u8 => {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    return false;
                }
                m if m == Mode::Close as u8 => return false,
                m if m == Mode::Slow as u8 => tokio::time::sleep(Duration::from_millis(300)).await,
                _ => {}
            }
            if s.write_all(reply).await.is_err() {
                return false;
            }
            if accepted {
                self.seen.lock().unwrap()[idx].accepted = true;
            }
            true
        }
    }
}

/// One request: head text and body (by `content-length`).
pub async fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(String, Vec<u8>)> {
    let mut tmp = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case("content-length").then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = s.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    let body = buf[head_end..head_end + len].to_vec();
    buf.drain(..head_end + len);
    Some((head, body))
}

/// `t=<unix>,v1=<hex>` with v1 = HMAC-SHA256(secret, "<t>.<body>"), and t
/// within five minutes of now.
pub fn verify(secret: &[u8], header: &str, body: &[u8]) -> bool {
    let mut t = None;
    let mut v1 = None;
    for part in header.split(',') {
        match part.split_once('=') {
            Some(("t", x)) => t = x.parse::<u64>().ok(),
            Some(("v1", x)) => v1 = hex::decode(x).ok(),
            _ => {}
        }
    }
    let (Some(t), Some(v1)) = (t, v1) else { return false };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    if now.abs_diff(t) > 300 {
        return false;
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    mac.verify_slice(&v1).is_ok()
}

/// Every accepted request of a channel continues where the previous one
/// ended (no gap), in order, each one consecutive; `strict`: no repeats
/// either. Returns the highest seq delivered.
pub fn check_order(channel: &str, batches: &[Vec<u64>], strict: bool) -> u64 {
    let mut last = 0;
    for b in batches {
        assert!(!b.is_empty(), "{channel}: empty request");
        assert!(b.windows(2).all(|w| w[1] == w[0] + 1), "{channel}: batch not consecutive: {b:?}");
        assert!(b[0] <= last + 1, "{channel}: gap, after {last} came {b:?}");
        if strict {
            assert_eq!(b[0], last + 1, "{channel}: after {last} came {b:?}");
        }
        last = last.max(*b.last().unwrap());
    }
    last
}
