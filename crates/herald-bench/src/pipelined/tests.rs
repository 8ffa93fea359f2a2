//! A pipelined publisher against a fake Herald on a real socket: the
//! window is never exceeded, answers in any order are accounted, and a
//! refusal stops the publisher.

use std::net::SocketAddr;

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_websockets::{Message, ServerBuilder};

use super::{PipelinePlan, WsPublisher};
use crate::args::Peer;
use crate::protocol::{Endpoint, WsAuth};

/// What the fake server saw of one publish frame.
#[derive(Debug, PartialEq)]
struct Seen {
    req: u64,
    channel: String,
    n: u64,
}

/// Accept one connection and read `total` publish frames. Answers are held
/// back until `window` are unanswered (or all `total` arrived), then given
/// newest first. With `window` unanswered the client must be waiting: a
/// frame arriving within [`OVERRUN_WAIT`] means it overran its window.
/// `refuse` is answered with an error.
async fn fake_herald(
    listener: TcpListener,
    total: usize,
    window: usize,
    refuse: Option<u64>,
) -> anyhow::Result<Vec<Seen>> {
    let (stream, _) = listener.accept().await?;
    let (_req, mut ws) = ServerBuilder::new().accept(stream).await?;
    let mut seen = Vec::new();
    let mut unanswered = Vec::new();
    while seen.len() < total {
        let Some(msg) = ws.next().await else { break };
        let msg = msg?;
        if !msg.is_text() {
            continue;
        }
        anyhow::ensure!(unanswered.len() < window, "frame beyond the window of {window}");
        let v: serde_json::Value = serde_json::from_slice(&msg.as_payload()[..])?;
        anyhow::ensure!(v["type"] == "publish", "not a publish: {v}");
        let req = v["req"].as_u64().unwrap_or(0);
        seen.push(Seen {
            req,
            channel: v["channel"].as_str().unwrap_or("").to_owned(),
            n: v["data"]["n"].as_u64().unwrap_or(u64::MAX),
        });
        unanswered.push(req);
        if unanswered.len() == window && seen.len() < total {
            // A slow client could pass this unnoticed, never a correct
            // one fail it.
            if let Ok(Some(extra)) = tokio::time::timeout(OVERRUN_WAIT, ws.next()).await {
                anyhow::bail!("a frame beyond the window of {window}: {extra:?}");
            }
        }
        if unanswered.len() == window || seen.len() == total || Some(req) == refuse {
            for req in unanswered.drain(..).rev() {
                let answer = if Some(req) == refuse {
                    format!(r#"{{"type":"error","req":{req},"code":"forbidden","message":"no"}}"#)
                } else {
                    format!(r#"{{"type":"ok","req":{req},"channel":"chat:a","seq":{req}}}"#)
                };
                ws.send(Message::text(answer)).await?;
            }
        }
        if refuse.is_some_and(|r| r == req) {
            // The client stops sending; it must not wait for more answers.
            break;
        }
    }
    // Keep the socket open until the client closes it.
    while let Some(Ok(_)) = ws.next().await {}
    Ok(seen)
}

/// How long the fake server waits for a frame the window forbids.
const OVERRUN_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

async fn setup() -> (TcpListener, Endpoint) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let ep = Endpoint {
        peer: Peer::Herald,
        addr,
        authority: addr.to_string(),
        auth: WsAuth::Dev,
        wire: crate::args::SubWire::Herald,
    };
    (listener, ep)
}

fn plan<'a>(targets: &'a [String], rounds: u64, window: usize) -> PipelinePlan<'a> {
    PipelinePlan {
        targets,
        n0: 10,
        rounds,
        size: 64,
        interval: None,
        window,
        deadline: Instant::now() + std::time::Duration::from_secs(20),
    }
}

#[tokio::test]
async fn keeps_the_window_and_accounts_answers_in_any_order() {
    let (listener, ep) = setup().await;
    let server = tokio::spawn(fake_herald(listener, 24, 5, None));
    let mut publisher = WsPublisher::connect(&ep, "pub").await.unwrap();
    let targets = vec![publisher.target("chat:a"), publisher.target("chat:b")];
    let stats = publisher.run(plan(&targets, 12, 5)).await;
    publisher.close().await;
    let seen = server.await.unwrap().unwrap();
    assert!(stats.errors.is_empty(), "{:?}", stats.errors);
    assert_eq!((stats.sent, stats.acked, stats.refused, stats.latency.count()), (24, 24, 0, 24));
    // Round-robin over the channels, one round after the other, requests
    // numbered in the order written.
    let want: Vec<Seen> = (0..24u64)
        .map(|i| Seen {
            req: i + 1,
            channel: if i % 2 == 0 { "chat:a" } else { "chat:b" }.to_owned(),
            n: 10 + i / 2,
        })
        .collect();
    assert_eq!(seen, want);
}

#[tokio::test]
async fn a_refused_publish_stops_the_publisher_and_is_reported() {
    let (listener, ep) = setup().await;
    let server = tokio::spawn(fake_herald(listener, 100, 1, Some(3)));
    let mut publisher = WsPublisher::connect(&ep, "pub").await.unwrap();
    let targets = vec![publisher.target("chat:a")];
    let stats = publisher.run(plan(&targets, 100, 1)).await;
    publisher.close().await;
    let seen = server.await.unwrap().unwrap();
    assert_eq!(seen.len(), 3, "nothing sent after the refusal");
    assert_eq!((stats.sent, stats.acked, stats.refused), (3, 2, 1));
    assert!(
        stats.errors.iter().any(|e| e.contains("req 3 refused") && e.contains("forbidden")),
        "{:?}",
        stats.errors
    );
}
