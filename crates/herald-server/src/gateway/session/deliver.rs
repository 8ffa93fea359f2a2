//! Delivery to the socket: live messages from the outbox in batches, log
//! pages for subscriptions catching up, and the byte accounting of both.
//! Split from `session.rs` for size; same type, same invariants.
//!
//! What the session takes from its outbox or reads from the log stays
//! counted in its connection's byte bound (`ConnHandle::bytes`) and the
//! server's ceiling (`hub::QueuedBytes`) until the flush that writes it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::SinkExt;
use herald_core::delivery::{Live, Paged, Read};
use herald_core::Message;
use herald_proto::{close, ChannelName};
use tracing::Instrument;

use super::{ChannelTimers, Session, SessionEnd};
use crate::hub::Outgoing;

/// Most messages read from the log per catch-up step. Between steps the
/// session serves its other work, so one long catch-up does not starve the
/// rest. Pages are also sized to about a quarter of `websocket.outbox_bytes`
/// (by the frame sizes seen so far), so a page leaves room in the
/// connection's byte bound for live messages of its other subscriptions.
pub(super) const CATCHUP_PAGE: usize = 256;
/// Smallest frame size assumed when sizing catch-up pages.
const MIN_FRAME_ESTIMATE: usize = 64;
/// Wait before a catch-up step retries when the server is at its queued
/// bytes ceiling (plus up to as much again, random, so waiting sessions do
/// not retry together).
const CATCHUP_RETRY: Duration = Duration::from_millis(25);
/// Outbox frames written per flush: at ~200 bytes a frame, about the
/// 64 KiB the socket is written in at most (`ws::WRITE_BATCH_BYTES`).
const OUTBOX_BATCH: usize = 256;

/// What one catch-up read gave (see `Session::read_page`).
pub(super) enum PageStep {
    /// Nothing to send now.
    Idle,
    /// Send these, in order; `more`: queue another read after them.
    Send { messages: Vec<Arc<Message>>, more: bool },
}

impl Session {
    /// Live messages from the hub, written in batches with one flush.
    pub(super) async fn on_outbox(&mut self, first: Arc<Outgoing>) -> Result<(), SessionEnd> {
        let mut written = 0u64;
        let mut next = Some(first);
        let mut taken = 0;
        let mut closed = Vec::new();
        self.held.batch.reserve(OUTBOX_BATCH.min(self.handle.mailbox.outbox_len() + 1));
        while let Some(out) = next.take() {
            let send = if out.missed {
                self.on_missed(&out.msg);
                false
            } else {
                // The hub counted it against this connection.
                self.held.bytes += out.msg.frame.len();
                self.accept_live(&out.msg)
            };
            let frame = if send { self.wire.outgoing(&out) } else { None };
            if send && out.msg.closes {
                closed.push(out.msg.channel.clone());
            }
            // Held (and counted) until the flush, even if a kick drops this
            // future while the socket is full.
            self.held.batch.push(out);
            if let Some(frame) = frame {
                self.ws.feed(self.wire.frame(frame)).await.map_err(|_| SessionEnd::Gone)?;
                written += 1;
            }
            taken += 1;
            if taken < OUTBOX_BATCH {
                next = self.handle.mailbox.pop();
            }
        }
        for channel in closed {
            self.end_subscription(&channel, "room_closed").await?;
        }
        if written > 0 {
            self.ws.flush().await.map_err(|_| SessionEnd::Gone)?;
            self.state.metrics.delivered.inc_by(written);
        }
        self.release_held();
        Ok(())
    }

    /// What the last flush wrote no longer counts against the byte bounds.
    fn release_held(&mut self) {
        self.handle.mailbox.queued.sub(std::mem::take(&mut self.held.bytes));
        self.held.batch = Vec::new();
        self.held.page = None;
    }

    /// A live message the hub could not queue (the server was at its
    /// ceiling). A durable subscription taking live messages reads it from
    /// the log instead: handed to the state machine as if the message after
    /// it had arrived, which is a gap, so the subscription reads the log
    /// from its `next` (and pauses there if its acked window is full).
    fn on_missed(&mut self, msg: &Message) {
        let Some(seq) = msg.seq else { return };
        let Some(log) = self.chans.regs.subs.get_mut(&msg.channel).and_then(|s| s.log.as_mut()) else {
            return;
        };
        if seq < log.delivery.next() {
            return; // already delivered
        }
        let mut timers = ChannelTimers { queue: &mut self.chans.timers, channel: &msg.channel };
        if log.delivery.on_live(seq + 1, &msg.epoch, &mut timers) == Live::Read {
            self.chans.catchup.push_back(msg.channel.clone());
        }
    }

    /// The server ends a subscription whose channel closed (its final
    /// message was just sent): drop it, without a presence leave (closing
    /// cleared the channel's presence), and tell the client.
    pub(super) async fn end_subscription(
        &mut self,
        channel: &ChannelName,
        reason: &str,
    ) -> Result<(), SessionEnd> {
        if let Some(sub) = self.chans.regs.remove(channel) {
            if let Some(mut log) = sub.log {
                log.delivery.end(&mut ChannelTimers { queue: &mut self.chans.timers, channel });
            }
            self.chans.catchup.retain(|c| c != channel);
            self.ws
                .feed(self.wire.frame(Bytes::from(self.wire.unsubscribed(channel, reason))))
                .await
                .map_err(|_| SessionEnd::Gone)?;
        }
        Ok(())
    }

    /// Decide whether a live message goes out now (see `herald_core::delivery`).
    fn accept_live(&mut self, msg: &Message) -> bool {
        let Some(sub) = self.chans.regs.subs.get_mut(&msg.channel) else { return false };
        // Volatile messages and presence events (no seq): live only, on any channel.
        let Some(seq) = msg.seq else { return true };
        // A logged message for a volatile subscription cannot happen
        // (delivery is per namespace); drop it rather than break the order.
        let Some(log) = sub.log.as_mut() else { return false };
        let mut timers = ChannelTimers { queue: &mut self.chans.timers, channel: &msg.channel };
        match log.delivery.on_live(seq, &msg.epoch, &mut timers) {
            Live::Send => true,
            Live::Skip => false,
            Live::Read => {
                self.chans.catchup.push_back(msg.channel.clone());
                false
            }
        }
    }

    /// One page of catch-up for the subscription at the front of the queue.
    pub(super) async fn catchup_step(&mut self) -> Result<(), SessionEnd> {
        let Some(channel) = self.chans.catchup.pop_front() else { return Ok(()) };
        let page_bytes = self.state.config().websocket.outbox_bytes / 4;
        let page_len = (page_bytes / self.held.frame_estimate.max(MIN_FRAME_ESTIMATE)).clamp(1, CATCHUP_PAGE);
        let span = tracing::trace_span!(
            target: crate::trace::TARGET,
            "herald.catchup",
            channel = %channel,
            messages = tracing::field::Empty,
        );
        let read = self.read_page(&channel, page_len, true).instrument(span.clone()).await?;
        if let PageStep::Send { messages, .. } = &read {
            span.record("messages", messages.len());
        }
        let (messages, more) = match read {
            PageStep::Idle => return Ok(()),
            PageStep::Send { messages, more } => (messages, more),
        };
        let mut closes = false;
        let mut written = 0;
        for msg in &messages {
            if let Some(frame) = self.wire.message(msg) {
                self.ws.feed(self.wire.frame(frame)).await.map_err(|_| SessionEnd::Gone)?;
                written += 1;
            }
            closes |= msg.closes;
        }
        self.state.metrics.delivered.inc_by(written);
        if closes {
            // The room's final message was in this page: no further read.
            self.end_subscription(&channel, "room_closed").await?;
        }
        if !messages.is_empty() {
            self.ws.flush().await.map_err(|_| SessionEnd::Gone)?;
        }
        self.release_held();
        if more && !closes {
            self.chans.catchup.push_back(channel);
        }
        Ok(())
    }

    /// Read the next page of `channel`'s catch-up (at most `page_len`
    /// messages) and run it through the subscription's state machine: the
    /// messages to send now, in order, and whether another read is due
    /// (the caller queues it after sending). With `charge`, the page is cut
    /// to what fits the byte bounds and counted until the next
    /// `release_held`; when nothing fits, the read is queued again after a
    /// pause. Catch-up (`catchup_step`) and Centrifugo's recovery (the
    /// publications of a subscribe reply) both go through here.
    pub(super) async fn read_page(
        &mut self,
        channel: &ChannelName,
        page_len: usize,
        charge: bool,
    ) -> Result<PageStep, SessionEnd> {
        // None: unsubscribed meanwhile, live, or paused by a full window (an
        // ack queues it again).
        let Some(read) = self
            .chans
            .regs
            .subs
            .get(channel)
            .and_then(|s| s.log.as_ref())
            .and_then(|l| l.delivery.read(page_len))
        else {
            return Ok(PageStep::Idle);
        };
        let page = match self.state.engine.read(channel, read.after, read.limit).await {
            Ok(page) => page,
            Err(e) => {
                tracing::warn!(channel = %channel, error = %e, "catch-up read failed");
                return Err(SessionEnd::Close {
                    code: close::INTERNAL,
                    reason: "storage unavailable",
                    reconnect: true,
                });
            }
        };
        if !page.messages.is_empty() {
            let total: usize = page.messages.iter().map(|m| m.frame.len()).sum();
            self.held.frame_estimate = (total / page.messages.len()).max(MIN_FRAME_ESTIMATE);
        }
        // Send the part of the page that fits the byte bounds; the rest is
        // read again next step (as if the read had asked for fewer).
        let fits = if charge { self.charge_page(&page.messages) } else { Some(page.messages.len()) };
        let Some(fits) = fits else {
            self.state.hub.shed();
            self.chans.catchup.push_front(channel.clone());
            let wait = CATCHUP_RETRY + CATCHUP_RETRY.mul_f64(fastrand::f64());
            self.chans.pause = Some(Box::pin(tokio::time::sleep(wait)));
            return Ok(PageStep::Idle);
        };
        let read = if fits < page.messages.len() { Read { limit: fits, ..read } } else { read };
        let mut messages = page.messages;
        messages.truncate(fits);
        // Same task: the subscription cannot have gone during the await.
        let Some(log) = self.chans.regs.subs.get_mut(channel).and_then(|s| s.log.as_mut()) else {
            self.release_held();
            return Ok(PageStep::Idle);
        };
        let mut timers = ChannelTimers { queue: &mut self.chans.timers, channel };
        let seqs = messages.iter().map(|m| m.seq.unwrap_or(0));
        match log.delivery.on_page(read, &page.position, seqs, &mut timers) {
            // The log was reset or trimmed past what this client has seen:
            // it must resubscribe, and the reply will say so.
            Paged::Resync => {
                Err(SessionEnd::Close { code: close::RESYNC, reason: "resync needed", reconnect: true })
            }
            Paged::Ignore { more } => {
                self.release_held();
                if more {
                    self.chans.catchup.push_back(channel.clone());
                }
                Ok(PageStep::Idle)
            }
            Paged::Send { more } => Ok(PageStep::Send { messages, more }),
        }
    }

    /// Count the longest prefix of a page that fits both this connection's
    /// byte bound (at least one message when it holds nothing) and the
    /// server's ceiling; returns its length, or `None` when not even one
    /// message fits (wait and read again).
    fn charge_page(&mut self, messages: &[Arc<Message>]) -> Option<usize> {
        if messages.is_empty() {
            return Some(0);
        }
        let websocket = &self.state.config().websocket;
        let queued = &self.state.hub.queued;
        let used = self.handle.mailbox.queued.get();
        let room = websocket.outbox_bytes.saturating_sub(used).min(queued.room());
        let mut bytes = 0;
        let mut fits = 0;
        for m in messages {
            let next = bytes + m.frame.len();
            let oversized_first = fits == 0 && used == 0 && next <= queued.room();
            if next > room && !oversized_first {
                break;
            }
            bytes = next;
            fits += 1;
        }
        if fits == 0 {
            return None;
        }
        let charge = queued.try_charge(bytes)?;
        self.handle.mailbox.queued.add(bytes);
        self.held.bytes += bytes;
        self.held.page = Some(charge);
        Some(fits)
    }
}
