//! The per-subscription queue: judge each message against the
//! subscription's resume position, hand it over without waiting, and only
//! when the caller's queue is full wait for room (backpressure on the
//! socket).

use std::sync::atomic::Ordering;

use herald_proto::{ChannelName, MessageView};
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot};

use super::Worker;
use crate::command::Shared;
use crate::event::{Delivery, Event, SubscribeInfo};
use crate::resume::{ResumePoint, Verdict};
use crate::{ClientError, Connection};

/// Events a subscription's queue could not take yet, in order. Empty
/// `rest`: the subscription's caller is gone.
pub(super) struct Stalled {
    channel: String,
    rest: Vec<Result<Event, ClientError>>,
}

/// One wanted subscription. It stays in `subs` across reconnects until the
/// caller drops it or it fails for good.
pub(super) struct Sub {
    pub id: u64,
    pub channel: ChannelName,
    pub events_tx: mpsc::Sender<Result<Event, ClientError>>,
    pub resume: ResumePoint,
    /// The caller's `subscribe` is still waiting for the first reply.
    pub initial: Option<oneshot::Sender<Result<SubscribeInfo, ClientError>>>,
    /// The subscribe reply arrived on the current connection. Durable
    /// messages before it are leftovers of an earlier subscription to the
    /// same channel (the server sends `ok` before any message).
    pub confirmed: bool,
    /// Made by the server (`subscribed`): the server makes it again on
    /// each connection, so it is not resubscribed.
    pub server_side: bool,
}

impl Worker {
    /// Judge a `message` frame against its subscription's resume point and hand
    /// it over if the queue has room. `Some` when the rest needs
    /// [`Worker::finish_delivery`].
    pub(super) fn on_message(&mut self, view: MessageView) -> Option<Stalled> {
        let kind = herald_proto::FrameKind::parse(&view.kind).unwrap_or_default();
        let MessageView { channel, seq, id, ts, data, meta, .. } = view;
        let channel = channel?;
        // No sub: left over from an unsubscribe still in flight.
        let sub = self.subs.get_mut(channel.as_str())?;
        if seq.is_some() && !sub.confirmed {
            // A durable message before the subscribe reply belongs to an
            // earlier subscription on this connection (see `Sub::confirmed`).
            return None;
        }
        let gap = match sub.resume.on_message(seq) {
            Verdict::Duplicate => return None,
            Verdict::Deliver => None,
            Verdict::Gap { expected } => {
                let got = seq.unwrap_or(expected);
                tracing::warn!(channel = %sub.channel, expected, got, "herald delivery gap");
                Some(Event::Gap { channel: sub.channel.clone(), expected, got })
            }
        };
        let message = Event::Message(Delivery {
            channel: sub.channel.clone(),
            kind,
            seq,
            id: id.unwrap_or_default(),
            ts: ts.unwrap_or(0),
            data: data.unwrap_or_else(|| RawValue::NULL.to_owned()),
            meta,
        });
        self.offer(channel, gap.into_iter().chain(Some(message)).map(Ok))
    }

    /// Hand events to a subscription without waiting. `Some` when its
    /// queue is full (the rest, in order, must wait) or its caller is gone.
    pub(super) fn offer(
        &mut self,
        channel: String,
        mut events: impl Iterator<Item = Result<Event, ClientError>>,
    ) -> Option<Stalled> {
        let sub = self.subs.get(channel.as_str())?;
        while let Some(ev) = events.next() {
            match sub.events_tx.try_send(ev) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(ev)) => {
                    let rest = std::iter::once(ev).chain(events).collect();
                    return Some(Stalled { channel, rest });
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    return Some(Stalled { channel, rest: Vec::new() });
                }
            }
        }
        None
    }

    /// Deliver what [`Worker::offer`] could not, waiting for room: a slow
    /// caller stalls the socket, which is the backpressure we want (the
    /// server disconnects a slow consumer and we resume from the resume point).
    /// A subscription whose caller is gone is dropped and unsubscribed. A
    /// closing client abandons the wait.
    pub(super) async fn finish_delivery(&mut self, conn: &mut Connection, stalled: Stalled) {
        let Stalled { channel, rest } = stalled;
        let mut gone = rest.is_empty();
        for ev in rest {
            let Some(sub) = self.subs.get(channel.as_str()) else { return };
            match wait_for_room(&sub.events_tx, &self.shared, ev).await {
                Room::Sent => {}
                Room::Closing => return,
                Room::Gone => {
                    gone = true;
                    break;
                }
            }
        }
        if gone {
            self.subs.remove(channel.as_str());
            // A failed send ends the session on the next read anyway.
            let _ = self.send_unsubscribe(conn, &channel).await;
        }
    }

    /// Offer one event and wait for room if needed.
    pub(super) async fn deliver(
        &mut self,
        conn: &mut Connection,
        channel: &str,
        ev: Result<Event, ClientError>,
    ) {
        if let Some(stalled) = self.offer(channel.to_owned(), std::iter::once(ev)) {
            self.finish_delivery(conn, stalled).await;
        }
    }
}

/// Outcome of [`wait_for_room`].
enum Room {
    Sent,
    /// The subscription's receiver is gone.
    Gone,
    /// The client is closing; the event was dropped.
    Closing,
}

/// Wait until the subscription's queue has room, or the client closes.
async fn wait_for_room(
    tx: &mpsc::Sender<Result<Event, ClientError>>,
    shared: &Shared,
    ev: Result<Event, ClientError>,
) -> Room {
    // Created before the flag check so a close in between still wakes us.
    let closing = shared.closing_notify.notified();
    if shared.closing.load(Ordering::Acquire) {
        return Room::Closing;
    }
    tokio::select! {
        biased;
        permit = tx.reserve() => match permit {
            Ok(permit) => {
                permit.send(ev);
                Room::Sent
            }
            Err(_) => Room::Gone,
        },
        () = closing => Room::Closing,
    }
}
