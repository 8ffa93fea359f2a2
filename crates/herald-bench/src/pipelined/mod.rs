//! Pipelined WebSocket publishers (`--publish-via ws`): one connection
//! writes publish frames back to back, with at most `--window` of them
//! unanswered, the way NATS clients and `nats bench` publish. What `max`
//! then measures is how fast the server takes publishes, not one round
//! trip per publish.
//!
//! The connection is split: the writer feeds frames and flushes only when
//! the window is full, a paced send is due, or it is done; the reader
//! takes the answers (each one frees its slot and records the publish →
//! answer time) and never stops reading, so neither side can block the
//! other through full socket buffers. Both run in one task. Protocol pings
//! the reader must answer go to the writer through a queue.
//!
//! What the server answers, per protocol, is in [`codec`]; the accounting
//! of unanswered publishes in [`window`].

pub mod codec;
pub mod window;

use std::cell::RefCell;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tokio_websockets::Message;

use crate::hist::Histogram;
use crate::payload;
use crate::protocol::{Endpoint, Ws, HANDSHAKE_TIMEOUT};
use codec::{Answer, PubCodec};
use window::Window;

/// Errors kept per run (the first ones say what went wrong).
const MAX_ERRORS: usize = 8;

/// One pipelined publishing connection.
pub struct WsPublisher {
    sink: SplitSink<Ws, Message>,
    stream: SplitStream<Ws>,
    codec: PubCodec,
    /// Request id of the next publish (ids keep counting across runs).
    next_req: u64,
    /// Set when a run ended with the connection unusable.
    broken: Option<String>,
}

/// What one [`WsPublisher::run`] sends: for each round `n` in
/// `n0..n0 + rounds`, one message to each target in turn (`targets` from
/// [`WsPublisher::target`]), paced `interval` apart (`None`: back to back),
/// with at most `window` unanswered, everything answered by `deadline`.
pub struct PipelinePlan<'a> {
    pub targets: &'a [String],
    pub n0: u64,
    pub rounds: u64,
    pub size: usize,
    pub interval: Option<Duration>,
    pub window: usize,
    pub deadline: Instant,
}

/// What a run did.
#[derive(Debug, Default)]
pub struct PipelineStats {
    /// Publish frames written.
    pub sent: u64,
    /// Answered as published.
    pub acked: u64,
    /// Answered as refused (nothing published).
    pub refused: u64,
    /// Publish → answer time, µs (a NATS `PONG` answers every `PUB` it
    /// covers at once).
    pub latency: Histogram,
    /// First publish written → last answer.
    pub elapsed: Duration,
    /// What went wrong, first ones only; empty when every publish was
    /// answered as published.
    pub errors: Vec<String>,
}

impl PipelineStats {
    fn note(&mut self, e: String) {
        if self.errors.len() < MAX_ERRORS {
            self.errors.push(e);
        }
    }

    pub fn merge(&mut self, o: &PipelineStats) {
        self.sent += o.sent;
        self.acked += o.acked;
        self.refused += o.refused;
        self.latency.merge(&o.latency);
        self.elapsed = self.elapsed.max(o.elapsed);
        for e in &o.errors {
            self.note(e.clone());
        }
    }
}

/// State the writer and the reader share within one run.
struct Shared {
    window: Window,
    stats: PipelineStats,
    first_sent: Option<Instant>,
    last_answer: Option<Instant>,
    /// Stop sending (a refusal, or an answer the window cannot place).
    stop: bool,
    done_sending: bool,
}

impl WsPublisher {
    /// Open the connection (as `user` where the protocol names one) and
    /// run the protocol's opening.
    pub async fn connect(ep: &Endpoint, user: &str) -> anyhow::Result<WsPublisher> {
        let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
        let mut codec = PubCodec::new(ep.peer)
            .with_context(|| format!("`--peer {}` takes no WebSocket publishes", ep.peer.name()))?;
        let path = codec.path(&ep.auth, user);
        let mut ws = crate::protocol::connect(ep, None, &path, deadline)
            .await
            .context("cannot open the publishing connection")?;
        codec.handshake(&mut ws, deadline).await.context("publishing connection handshake")?;
        let (sink, stream) = ws.split();
        Ok(WsPublisher { sink, stream, codec, next_req: 1, broken: None })
    }

    /// `channel` as this connection's publish frames name it.
    pub fn target(&self, channel: &str) -> String {
        self.codec.target(channel)
    }

    /// Publish as `plan` says and wait for every answer; never fails as a
    /// whole: what went wrong is in the stats.
    pub async fn run(&mut self, plan: PipelinePlan<'_>) -> PipelineStats {
        if let Some(why) = &self.broken {
            let mut stats = PipelineStats::default();
            stats.note(format!("the publishing connection is gone: {why}"));
            return stats;
        }
        let shared = RefCell::new(Shared {
            window: Window::new(plan.window, self.next_req),
            stats: PipelineStats::default(),
            first_sent: None,
            last_answer: None,
            stop: false,
            done_sending: false,
        });
        let codec = RefCell::new(&mut self.codec);
        let (room, drained) = (Notify::new(), Notify::new());
        let (reply_tx, reply_rx) = mpsc::unbounded_channel();
        let io = Io { shared: &shared, codec: &codec, room: &room, drained: &drained };
        let writer = io.write(&mut self.sink, reply_rx, &plan);
        let reader = io.read(&mut self.stream, reply_tx);
        let outcome = tokio::time::timeout_at(plan.deadline, async {
            tokio::select! {
                r = writer => r,
                r = reader => r.and(Err(anyhow!("the reader stopped"))),
            }
        })
        .await;
        let mut shared = shared.into_inner();
        let failure = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("{e:#}")),
            Err(_) => Some(format!(
                "publishing did not finish before the deadline ({} sent, {} unanswered)",
                shared.stats.sent,
                shared.window.outstanding()
            )),
        };
        if let Some(why) = failure {
            shared.stats.note(why.clone());
            self.broken = Some(why);
        }
        self.next_req = shared.window.next_req();
        let mut stats = shared.stats;
        stats.acked = shared.window.acked;
        stats.refused = shared.window.refused;
        if let (Some(first), Some(last)) = (shared.first_sent, shared.last_answer) {
            stats.elapsed = last.saturating_duration_since(first);
        }
        stats
    }

    /// Close politely, bounded.
    pub async fn close(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(1), self.sink.close()).await;
    }
}

/// The borrowed pieces of one run.
#[derive(Clone, Copy)]
struct Io<'a, 'c> {
    shared: &'a RefCell<Shared>,
    codec: &'a RefCell<&'c mut PubCodec>,
    /// The reader freed a slot.
    room: &'a Notify,
    /// The reader took the last answer after the writer finished.
    drained: &'a Notify,
}

type Sink = SplitSink<Ws, Message>;

impl Io<'_, '_> {
    async fn write(
        self,
        sink: &mut Sink,
        mut replies: mpsc::UnboundedReceiver<Message>,
        plan: &PipelinePlan<'_>,
    ) -> anyhow::Result<()> {
        let start = Instant::now();
        let mut k = 0u32;
        let mut last_req = None;
        'all: for n in plan.n0..plan.n0 + plan.rounds {
            for target in plan.targets {
                if let Some(iv) = plan.interval {
                    self.wait_until(sink, &mut replies, start + iv * k).await?;
                }
                k = k.saturating_add(1);
                loop {
                    {
                        let s = self.shared.borrow();
                        if s.stop {
                            break 'all;
                        }
                        if s.window.has_room() {
                            break;
                        }
                    }
                    // Full: make sure what is queued reaches the server
                    // (and, for NATS, that something will answer it).
                    let ping = self.codec.borrow_mut().before_wait(last_req);
                    if let Some(ping) = ping {
                        sink.feed(ping).await?;
                    }
                    sink.flush().await?;
                    tokio::select! {
                        () = self.room.notified() => {}
                        Some(reply) = replies.recv() => sink.feed(reply).await?,
                    }
                }
                while let Ok(reply) = replies.try_recv() {
                    sink.feed(reply).await?;
                }
                let body = payload::encode(n, plan.size);
                let (req, frame) = {
                    let now = Instant::now();
                    let mut s = self.shared.borrow_mut();
                    s.first_sent.get_or_insert(now);
                    s.stats.sent += 1;
                    let req = s.window.send(now);
                    (req, self.codec.borrow().publish(req, target, &body))
                };
                sink.feed(frame).await.context("WebSocket write failed")?;
                last_req = Some(req);
                let ping = self.codec.borrow_mut().after_publish(req);
                if let Some(ping) = ping {
                    sink.feed(ping).await?;
                }
                if plan.interval.is_some() {
                    // Paced: this publish goes out now, and (NATS) is
                    // answered on its own.
                    let ping = self.codec.borrow_mut().before_wait(last_req);
                    if let Some(ping) = ping {
                        sink.feed(ping).await?;
                    }
                    sink.flush().await.context("WebSocket write failed")?;
                }
            }
        }
        let ping = self.codec.borrow_mut().before_wait(last_req);
        if let Some(ping) = ping {
            sink.feed(ping).await?;
        }
        sink.flush().await.context("WebSocket write failed")?;
        self.shared.borrow_mut().done_sending = true;
        // Keep answering protocol pings until the last answer is in.
        while self.shared.borrow().window.outstanding() > 0 {
            tokio::select! {
                () = self.drained.notified() => {}
                Some(reply) = replies.recv() => {
                    sink.feed(reply).await?;
                    sink.flush().await?;
                }
            }
        }
        Ok(())
    }

    /// Sleep until `at`, writing protocol replies meanwhile.
    async fn wait_until(
        self,
        sink: &mut Sink,
        replies: &mut mpsc::UnboundedReceiver<Message>,
        at: Instant,
    ) -> anyhow::Result<()> {
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(at) => return Ok(()),
                Some(reply) = replies.recv() => {
                    sink.feed(reply).await?;
                    sink.flush().await?;
                }
            }
        }
    }

    /// Take answers until the connection ends (an error: the writer ends
    /// the run).
    async fn read(
        self,
        stream: &mut SplitStream<Ws>,
        replies: mpsc::UnboundedSender<Message>,
    ) -> anyhow::Result<()> {
        let mut answers = Vec::new();
        loop {
            let msg = stream
                .next()
                .await
                .ok_or_else(|| anyhow!("the server closed the publishing connection"))?
                .context("WebSocket read failed")?;
            if let Some((code, reason)) = msg.as_close() {
                bail!("the server closed the publishing connection ({}: {reason})", u16::from(code));
            }
            if !(msg.is_text() || msg.is_binary()) {
                continue; // tokio-websockets answers pings itself
            }
            self.codec.borrow_mut().decode(&msg, &mut answers)?;
            let now = Instant::now();
            let mut s = self.shared.borrow_mut();
            let Shared { window, stats, .. } = &mut *s;
            let (mut stop, mut answered) = (false, false);
            for answer in answers.drain(..) {
                answered |= !matches!(answer, Answer::Reply(_));
                let placed = match answer {
                    Answer::Ok(req) => {
                        window.answer(req, true, now).map(|d| stats.latency.record(d.as_micros() as u64))
                    }
                    Answer::OkThrough(req) => window
                        .answer_through(req, now, |d| stats.latency.record(d.as_micros() as u64))
                        .map(drop),
                    Answer::Refused { req, why } => {
                        stop = true;
                        stats.note(format!("publish req {req} refused: {why}"));
                        window.answer(req, false, now).map(drop)
                    }
                    Answer::Reply(reply) => {
                        // The writer outlives the reader within a run.
                        let _ = replies.send(reply);
                        Ok(())
                    }
                    Answer::Fatal(why) => bail!("{why}"),
                };
                if let Err(e) = placed {
                    stop = true;
                    stats.note(format!("server answer out of place: {e}"));
                }
            }
            if answered {
                s.last_answer = Some(now);
            }
            s.stop |= stop;
            if s.window.has_room() || s.stop {
                self.room.notify_one();
            }
            if s.done_sending && s.window.outstanding() == 0 {
                self.drained.notify_one();
            }
        }
    }
}

#[cfg(test)]
mod tests;
