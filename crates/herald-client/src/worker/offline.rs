//! Serving handles while there is no connection: subscriptions are
//! recorded (sent on the next connection, with everything else) and
//! publishes wait in a bounded buffer.

use herald_proto::ChannelName;
use tokio::sync::oneshot;

use super::queue::Sub;
use super::Worker;
use crate::command::{Command, SubscribeCmd};
use crate::resume::ResumePoint;
use crate::ClientError;

impl Worker {
    /// Drive `fut` while serving commands. `Err` when the client is asked to
    /// shut down (with the waiter to notify, if any).
    pub(super) async fn while_offline<F: std::future::Future + Unpin>(
        &mut self,
        mut fut: F,
    ) -> Result<F::Output, Option<oneshot::Sender<()>>> {
        loop {
            tokio::select! {
                biased;
                out = &mut fut => return Ok(out),
                cmd = self.cmd_rx.recv() => match cmd {
                    None => return Err(None),
                    Some(Command::Close { done }) => return Err(Some(done)),
                    Some(cmd) => self.on_command_offline(cmd),
                },
            }
        }
    }

    pub(super) fn on_command_offline(&mut self, cmd: Command) {
        match cmd {
            Command::Subscribe(cmd) => {
                // Sent on the next connection, with everything else.
                self.add_sub(*cmd);
            }
            Command::Unsubscribe { id, channel } => {
                self.remove_sub(id, &channel);
            }
            Command::Publish(cmd) => {
                if self.queued.len() >= self.opts.command_capacity.max(1) {
                    let _ = cmd.reply.send(Err(ClientError::Backlog));
                } else {
                    self.queued.push_back(cmd);
                }
            }
            Command::Close { .. } => unreachable!("handled by the caller"),
        }
    }

    /// Record a subscription. `false` (and the caller told) when the
    /// channel already has a live one.
    pub(super) fn add_sub(&mut self, cmd: SubscribeCmd) -> bool {
        let SubscribeCmd { id, channel, since, events_tx, reply } = cmd;
        if let Some(existing) = self.subs.get(channel.as_str()) {
            if !existing.events_tx.is_closed() {
                let _ = reply.send(Err(ClientError::AlreadySubscribed(channel.to_string())));
                return false;
            }
        }
        let sub = Sub {
            id,
            channel: channel.clone(),
            events_tx,
            resume: ResumePoint::new(since),
            initial: Some(reply),
            confirmed: false,
            server_side: false,
        };
        self.subs.insert(channel.as_str().into(), sub);
        true
    }

    /// Forget a subscription if it is still the one with this id. Returns
    /// whether it was removed.
    pub(super) fn remove_sub(&mut self, id: u64, channel: &ChannelName) -> bool {
        if self.subs.get(channel.as_str()).is_some_and(|s| s.id == id) {
            self.subs.remove(channel.as_str());
            return true;
        }
        false
    }
}
