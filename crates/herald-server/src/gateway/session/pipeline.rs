//! Pipelined publishes: a connection's `publish` frames are read and
//! submitted without waiting for the previous one to commit.
//!
//! The session holds at most one batch with the engine (`in_engine`) and
//! queues the publish frames read meanwhile (`queued`); when the batch is
//! answered, its replies go out (in one write) and the queued frames go to
//! the engine as the next batch, one submission
//! ([`AppState::publish_many`](crate::AppState::publish_many), one group commit on
//! the embedded engine). Frames that arrive together are read together
//! before a batch starts, so they share one submission too.
//!
//! Invariants:
//! - per channel, messages are appended in the order of their frames on
//!   the connection: batches go to the engine one at a time, each in frame
//!   order;
//! - each publish gets its own reply (`ok` with its `req` once its message
//!   is durable, or its `error`), in frame order; one refused publish does
//!   not affect the others;
//! - at most `websocket.max_publishes_in_flight` publishes are queued or with
//!   the engine, and reading stops once their `data` reaches
//!   `websocket.max_publish_bytes_in_flight` bytes (so it exceeds that by at
//!   most one publish's); at either bound the socket is not read
//!   (back-pressure: TCP slows the publisher down, nothing is buffered
//!   beyond it);
//! - any other frame first waits until every earlier publish is answered,
//!   so it sees their effects (frames act in the order they were sent);
//!   so does the peer's close frame (the publishes sent before it are
//!   appended, though their replies may no longer get through);
//! - a publish of a namespace with the publish proxy is appended only after
//!   the backend allowed it (with the `data` it answered), asked in frame
//!   order within the batch;
//! - a connection that ends with publishes in flight drops their replies;
//!   what the engine already took commits (as for a client that
//!   disconnects while waiting), under the dedup keys it was sent with.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::{maybe_done, MaybeDone};
use futures_util::SinkExt;
use herald_core::Receipt;
use herald_proto::ChannelName;
use tracing::Instrument;

use super::{Session, SessionEnd};
use crate::error::ApiError;
use crate::publish::Publish;

/// One publish frame: its `req`, channel, and the checked message (or why
/// it was refused before reaching the engine).
pub(super) struct Queued {
    pub req: Option<u64>,
    pub channel: ChannelName,
    pub publish: Result<Publish, ApiError>,
}

impl Queued {
    /// What it counts against `max_publish_bytes_in_flight`: its `data`
    /// (a refused publish holds none).
    fn bytes(&self) -> usize {
        self.publish.as_ref().map_or(0, |p| p.data.get().len())
    }
}

/// Publishes read and not yet answered, counted against the connection's
/// bounds.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Load {
    pub publishes: usize,
    /// Their `data`, in bytes.
    pub bytes: usize,
}

/// A publish's answer, ready to be sent.
pub(super) struct Answer {
    req: Option<u64>,
    channel: ChannelName,
    result: Result<Receipt, ApiError>,
}

/// The batch with the engine: resolves to one answer per frame, in order.
pub(super) type InEngine = Pin<Box<dyn Future<Output = Vec<Answer>> + Send>>;

/// The connection's pipeline.
#[derive(Default)]
pub(super) struct Pipeline {
    queued: Vec<Queued>,
    /// The `data` bytes of `queued`, kept as frames are queued (`may_read`
    /// asks before every frame read).
    queued_bytes: usize,
    /// The batch with the engine (its answers kept once it is done, until
    /// the session takes them) and what it carries.
    in_engine: Option<(MaybeDone<InEngine>, Load)>,
}

impl Pipeline {
    /// Publishes queued or with the engine.
    pub fn load(&self) -> Load {
        let engine = self.in_engine.as_ref().map_or(Load::default(), |(_, l)| *l);
        Load { publishes: self.queued.len() + engine.publishes, bytes: self.queued_bytes + engine.bytes }
    }

    /// Queue one publish frame (the batch starts in `Session::start_batch`).
    fn push(&mut self, q: Queued) {
        self.queued_bytes += q.bytes();
        self.queued.push(q);
    }

    /// The queued frames, as the next batch, and what they carry.
    fn take_queued(&mut self) -> (Vec<Queued>, Load) {
        let load = Load { publishes: self.queued.len(), bytes: std::mem::take(&mut self.queued_bytes) };
        (std::mem::take(&mut self.queued), load)
    }

    pub fn is_empty(&self) -> bool {
        self.queued.is_empty() && self.in_engine.is_none()
    }
}

/// The answers of the batch with the engine; pending while there is none.
pub(super) fn poll_in_engine(pipeline: &mut Pipeline, cx: &mut Context<'_>) -> Poll<Vec<Answer>> {
    match pipeline.in_engine.as_mut() {
        Some((fut, _)) => {
            std::task::ready!(Pin::new(&mut *fut).poll(cx));
            let answers = Pin::new(fut).take_output().expect("a done batch has its answers");
            pipeline.in_engine = None;
            Poll::Ready(answers)
        }
        None => Poll::Pending,
    }
}

/// Run the batch with the engine as far as it goes now (its checks and the
/// hand-off to the engine), keeping its answers if it is done.
fn kick(pipeline: &mut Pipeline, cx: &mut Context<'_>) {
    if let Some((fut, _)) = pipeline.in_engine.as_mut() {
        let _ = Pin::new(fut).poll(cx);
    }
}

/// About the size of one publish's `ok` (it grows the buffer when longer).
const ANSWER_SIZE_HINT: usize = 112;

impl Session {
    /// Whether the socket may be read: the pipeline is below both of its
    /// bounds.
    pub(super) fn may_read(&self) -> bool {
        let ws = &self.state.config().websocket;
        let load = self.pipeline.load();
        load.publishes < ws.max_publishes_in_flight && load.bytes < ws.max_publish_bytes_in_flight
    }

    /// Queue one publish frame (the batch starts in `start_batch`).
    pub(super) fn queue_publish(&mut self, q: Queued) {
        self.pipeline.push(q);
    }

    /// Hand the queued publishes to the engine as one batch, unless a batch
    /// is there already (it goes when that one is answered).
    pub(super) fn start_batch(&mut self) {
        if self.pipeline.in_engine.is_some() || self.pipeline.queued.is_empty() {
            return;
        }
        let (queued, load) = self.pipeline.take_queued();
        let n = load.publishes;
        let state = self.state.clone();
        let user = self.identity.sub.clone();
        let device = self.identity.device.clone();
        let span = tracing::trace_span!(target: crate::trace::TARGET, "herald.socket_publish", messages = n);
        let fut = async move {
            let mut heads = Vec::with_capacity(queued.len());
            let mut items = Vec::with_capacity(queued.len());
            for q in queued {
                heads.push((q.req, q.channel));
                // The backend's say (publish proxy, opted-in namespaces
                // only), after the key's fingerprint of what the client sent
                // and before the append; asked in frame order (proxies.rs).
                let item = match q.publish {
                    Ok(p) => {
                        crate::integration::proxies::check_publish(&state, &user, device.as_deref(), p).await
                    }
                    Err(e) => Err(e),
                };
                items.push(item);
            }
            let results = state.publish_many(items, true).await;
            heads
                .into_iter()
                .zip(results)
                .map(|((req, channel), result)| Answer { req, channel, result })
                .collect()
        }
        .instrument(span);
        self.pipeline.in_engine = Some((maybe_done(Box::pin(fut) as InEngine), load));
    }

    /// Start the next batch, then send this batch's answers in one write:
    /// the next batch reaches the engine before the answers are written
    /// (the engine is not left idle while they are).
    pub(super) async fn on_answers(&mut self, answers: Vec<Answer>) -> Result<(), SessionEnd> {
        self.start_batch();
        std::future::poll_fn(|cx| {
            kick(&mut self.pipeline, cx);
            Poll::Ready(())
        })
        .await;
        // Every answer is written into one buffer, and each goes out as its
        // own frame sharing it: two allocations per batch, not per publish.
        let mut buf = Vec::with_capacity(answers.len() * ANSWER_SIZE_HINT);
        let mut ends = Vec::with_capacity(answers.len());
        for a in answers {
            match a.result {
                Ok(receipt) => self.wire.push_published(&mut buf, a.req, &a.channel, &receipt),
                Err(e) => {
                    if !self
                        .budget
                        .take_error_reply(&self.state.config().rate_limits, std::time::Instant::now())
                    {
                        self.state.metrics.error_replies_dropped.inc();
                        continue;
                    }
                    buf.extend_from_slice(&self.wire.error(&e, a.req, Some(a.channel.as_str())));
                }
            }
            ends.push(buf.len());
        }
        let buf = Bytes::from(buf);
        let mut start = 0;
        for end in ends {
            let frame = buf.slice(start..end);
            start = end;
            self.ws.feed(self.wire.frame(frame)).await.map_err(|_| SessionEnd::Gone)?;
        }
        self.ws.flush().await.map_err(|_| SessionEnd::Gone)
    }

    /// Wait until every publish read so far is answered (before any other
    /// frame is handled).
    ///
    /// Every publish read goes to the engine even when the replies can no
    /// longer be written (after the peer's close frame the socket takes no
    /// more frames): the first write failure is returned once all are
    /// answered. A batch is a future that only runs while polled, so giving
    /// up at the first failure would drop the publishes queued behind it.
    pub(super) async fn settle_publishes(&mut self) -> Result<(), SessionEnd> {
        let mut written = Ok(());
        while !self.pipeline.is_empty() {
            self.start_batch();
            let answers = std::future::poll_fn(|cx| poll_in_engine(&mut self.pipeline, cx)).await;
            if written.is_ok() {
                written = self.on_answers(answers).await;
            }
        }
        written
    }
}
