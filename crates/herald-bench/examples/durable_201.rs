//! The durable HTTP baseline: the least a server can do and still answer a
//! publish only once it is on disk. Each POST's body goes to one writer
//! thread, which appends every body waiting to one file, fsyncs it once
//! (group commit, as Herald's store does), and only then are their `201`s
//! sent. No parsing, no auth, no dedup, no index: what is left is HTTP/1.1
//! on hyper and tokio (as Herald's) and the fsync. `GET /version` answers
//! `durable_201 <version>` (how `bench/table.py` tells it from nginx).
//!
//! ```text
//! cargo run --release -p herald-bench --example durable_201 -- 127.0.0.1:8790 /tmp/durable-201.log
//! herald bench publish --peer http201 --target http://127.0.0.1:8790 --publishers 64 --messages 60000 --size 100
//! ```
//!
//! `bench/run.sh --servers "herald-chat nginx-201 durable-201" --scenarios
//! publish` runs it beside the HTTP ceiling (nginx answering the same
//! requests with a fixed 201, nothing written): what share of the ceiling
//! a durable answer leaves on this machine, and what share of that Herald
//! reaches.

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, oneshot};

/// Requests the writer takes into one group commit at most.
const MAX_BATCH: usize = 1024;

struct Append {
    body: Bytes,
    reply: oneshot::Sender<u64>,
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr: SocketAddr = args.next().unwrap_or_else(|| "127.0.0.1:8790".into()).parse()?;
    let path: PathBuf = args.next().unwrap_or_else(|| "durable-201.log".into()).into();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("open {}", path.display()))?;
    let (tx, rx) = mpsc::channel::<Append>(4096);
    std::thread::Builder::new().name("writer".into()).spawn(move || write_loop(file, rx))?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        eprintln!("durable_201: listening on {addr}, appending to {}", path.display());
        serve(listener, tx).await
    })
}

/// One task per connection, HTTP/1.1 keep-alive, until the process is killed.
async fn serve(listener: tokio::net::TcpListener, tx: mpsc::Sender<Append>) -> anyhow::Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let tx = tx.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(req, tx.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(
    req: Request<Incoming>,
    tx: mpsc::Sender<Append>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    if req.method() == hyper::Method::GET && req.uri().path() == "/version" {
        let version = concat!("durable_201 ", env!("CARGO_PKG_VERSION"), "\n");
        return Ok(Response::new(Full::new(Bytes::from_static(version.as_bytes()))));
    }
    let body = req.into_body().collect().await?.to_bytes();
    let (reply, answer) = oneshot::channel();
    let status = match tx.send(Append { body, reply }).await {
        Ok(()) => match answer.await {
            Ok(seq) => return Ok(created(seq)),
            Err(_) => StatusCode::SERVICE_UNAVAILABLE,
        },
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = status;
    Ok(resp)
}

fn created(seq: u64) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(format!("{{\"seq\":{seq}}}"))));
    *resp.status_mut() = StatusCode::CREATED;
    resp.headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    resp
}

/// Take every append waiting (up to [`MAX_BATCH`]), write them with one
/// `write`, fsync once, answer them in order.
fn write_loop(mut file: std::fs::File, mut rx: mpsc::Receiver<Append>) {
    let mut seq = 0u64;
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut buf = Vec::new();
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(more) => batch.push(more),
                Err(_) => break,
            }
        }
        buf.clear();
        for a in &batch {
            buf.extend_from_slice(&(a.body.len() as u32).to_le_bytes());
            buf.extend_from_slice(&a.body);
        }
        if let Err(e) = file.write_all(&buf).and_then(|()| file.sync_all()) {
            eprintln!("durable_201: write failed: {e}");
            std::process::exit(1);
        }
        for a in batch.drain(..) {
            seq += 1;
            let _ = a.reply.send(seq);
        }
    }
}
