//! The parent's side of the worker processes: spawn them (the running
//! binary, as `bench worker`), hand out connection ranges and source
//! addresses, send commands and merge what comes back.

use std::net::Ipv4Addr;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::time::Instant;

use crate::args::BenchArgs;
use crate::proc_stats::{self, ProcSample};
use crate::protocol::Endpoint;
use crate::tally::Tally;
use crate::worker::wire::{Command, Event, Layout, ReconnectTally, WorkerSpec};

/// Slack on top of a worker's own deadline before the parent gives up on it.
const SLACK: Duration = Duration::from_secs(10);

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

/// The running workers and their connections.
pub struct Fleet {
    workers: Vec<Worker>,
    pub connected: u64,
}

/// What the scenario wants from the fleet.
pub struct FleetPlan {
    /// Connection `i` opens on `endpoints[i % len]` (see [`crate::worker::wire::node_for`]).
    pub endpoints: Vec<Endpoint>,
    pub run_id: String,
    pub connections: usize,
    pub layout: Layout,
    pub resume: bool,
    /// See [`WorkerSpec::resume_jitter_ms`].
    pub resume_jitter: Duration,
    /// How long the workers may live at most.
    pub lifetime: Duration,
}

impl Fleet {
    /// Spawn the workers, wait until each has opened its connections, and
    /// fail if any connection could not be opened.
    pub async fn start(args: &BenchArgs, plan: FleetPlan) -> anyhow::Result<Fleet> {
        let exe = std::env::current_exe().context("cannot find the running executable")?;
        let (n_workers, per) = worker_split(plan.connections, args.conns_per_worker, args.workers);
        let mut workers = Vec::with_capacity(n_workers);
        for k in 0..n_workers {
            let first = k * per;
            let count = per.min(plan.connections - first);
            let spec = WorkerSpec {
                endpoints: plan.endpoints.clone(),
                source: Some(source_address(args.source_base, k)?),
                run_id: plan.run_id.clone(),
                first,
                count,
                layout: plan.layout.clone(),
                resume: plan.resume,
                resume_jitter_ms: plan.resume_jitter.as_millis() as u64,
                connect_concurrency: args.connect_concurrency,
                phase_timeout_ms: args.timeout.as_millis() as u64,
                lifetime_ms: plan.lifetime.as_millis() as u64,
            };
            let mut child = tokio::process::Command::new(&exe)
                .args(["bench", "worker"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("cannot start worker process {}", exe.display()))?;
            let mut stdin = child.stdin.take().context("worker stdin")?;
            let stdout = BufReader::new(child.stdout.take().context("worker stdout")?).lines();
            let mut line = serde_json::to_vec(&spec)?;
            line.push(b'\n');
            stdin.write_all(&line).await.context("cannot send the worker its spec")?;
            workers.push(Worker { child, stdin, stdout });
        }
        let mut fleet = Fleet { workers, connected: 0 };
        let deadline = Instant::now() + args.timeout + SLACK;
        let (mut failed, mut retried) = (0, 0);
        let mut errors = Vec::new();
        let mut retry_errors = Vec::new();
        for k in 0..fleet.workers.len() {
            match fleet.read_event(k, deadline).await? {
                Event::Ready { connected, failed: f, errors: e, retried: r, retry_error } => {
                    fleet.connected += connected;
                    failed += f;
                    errors.extend(e);
                    retried += r;
                    retry_errors.extend(retry_error);
                }
                other => bail!("worker {k}: expected ready, got {other:?}"),
            }
        }
        if retried > 0 {
            println!(
                "   note: {retried} connection attempts failed and were retried, e.g. {}",
                retry_errors[0]
            );
        }
        if failed > 0 {
            errors.truncate(5);
            bail!(
                "{failed} of {} connections could not be opened; first errors:\n  {}",
                plan.connections,
                errors.join("\n  ")
            );
        }
        Ok(fleet)
    }

    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// CPU and RSS of the client side: this process (the publishers) plus
    /// every worker. `None` if a process is gone.
    pub fn client_sample(&self) -> Option<ProcSample> {
        let mut total = proc_stats::sample(std::process::id()).ok()?;
        for w in &self.workers {
            let s = proc_stats::sample(w.child.id()?).ok()?;
            total.cpu_ticks += s.cpu_ticks;
            total.sys_ticks += s.sys_ticks;
            total.rss_kb += s.rss_kb;
        }
        Some(total)
    }

    async fn broadcast(&mut self, cmd: &Command) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(cmd)?;
        line.push(b'\n');
        for (k, w) in self.workers.iter_mut().enumerate() {
            w.stdin.write_all(&line).await.with_context(|| format!("worker {k} is gone"))?;
        }
        Ok(())
    }

    async fn read_event(&mut self, k: usize, deadline: Instant) -> anyhow::Result<Event> {
        let w = &mut self.workers[k];
        let line = tokio::time::timeout_at(deadline, w.stdout.next_line())
            .await
            .map_err(|_| anyhow!("worker {k} did not answer in time"))?
            .with_context(|| format!("cannot read from worker {k}"))?
            .ok_or_else(|| anyhow!("worker {k} exited unexpectedly"))?;
        serde_json::from_str(&line).with_context(|| format!("worker {k} said something odd: {line}"))
    }

    /// Wait until every subscription has every `n < target_n`, or `timeout`;
    /// the period's counts over all workers.
    pub async fn collect(&mut self, target_n: u64, timeout: Duration) -> anyhow::Result<Tally> {
        self.collect_inner(target_n, false, timeout).await
    }

    /// [`Fleet::collect`], and also wait until every subscription acked
    /// everything it received (Herald's acked channels); the tally then
    /// carries each subscription's subscribe → last ack time, once.
    pub async fn collect_acked(&mut self, target_n: u64, timeout: Duration) -> anyhow::Result<Tally> {
        self.collect_inner(target_n, true, timeout).await
    }

    async fn collect_inner(
        &mut self,
        target_n: u64,
        wait_acks: bool,
        timeout: Duration,
    ) -> anyhow::Result<Tally> {
        let timeout_ms = timeout.as_millis() as u64;
        self.broadcast(&Command::Collect { target_n, wait_acks, timeout_ms }).await?;
        let deadline = Instant::now() + timeout + SLACK;
        let mut total = Tally::default();
        for k in 0..self.workers.len() {
            match self.read_event(k, deadline).await? {
                Event::Collected { tally } => total.merge(&tally),
                other => bail!("worker {k}: expected collected, got {other:?}"),
            }
        }
        Ok(total)
    }

    /// Drop and reconnect every connection with jitter.
    pub async fn drop_all(
        &mut self,
        window: Duration,
        pause: Duration,
        timeout: Duration,
    ) -> anyhow::Result<ReconnectTally> {
        let ms = |d: Duration| d.as_millis() as u64;
        let cmd = Command::Drop { window_ms: ms(window), pause_ms: ms(pause), timeout_ms: ms(timeout) };
        self.broadcast(&cmd).await?;
        let deadline = Instant::now() + window + pause + timeout + SLACK;
        let mut total = ReconnectTally::default();
        for k in 0..self.workers.len() {
            match self.read_event(k, deadline).await? {
                Event::Reconnected { tally } => total.merge(&tally),
                other => bail!("worker {k}: expected reconnected, got {other:?}"),
            }
        }
        Ok(total)
    }

    /// Close everything; workers that do not stop in time are killed.
    pub async fn stop(mut self) {
        let _ = self.broadcast(&Command::Stop).await;
        let deadline = Instant::now() + Duration::from_secs(5);
        for w in &mut self.workers {
            if tokio::time::timeout_at(deadline, w.child.wait()).await.is_err() {
                let _ = w.child.kill().await;
            }
        }
    }
}

/// Worker `k`'s source address: `base + k` (127.0.0.2, 127.0.0.3, …).
/// Worker processes for `connections` and connections per worker (the
/// last one takes the rest): none holds more than `per_worker`, there are
/// at least `min_workers` (0: one per CPU core) when there are connections
/// enough, and none is left without a connection.
fn worker_split(connections: usize, per_worker: usize, min_workers: usize) -> (usize, usize) {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let min_workers = if min_workers == 0 { cores } else { min_workers };
    let wanted = connections.div_ceil(per_worker).max(min_workers.min(connections)).max(1);
    let per = connections.div_ceil(wanted).max(1);
    (connections.div_ceil(per).max(1), per)
}

fn source_address(base: Ipv4Addr, k: usize) -> anyhow::Result<Ipv4Addr> {
    let ip = u32::from(base).checked_add(k as u32).context("source address overflow")?;
    let ip = Ipv4Addr::from(ip);
    if base.is_loopback() && !ip.is_loopback() {
        bail!("too many workers for loopback source addresses from {base}");
    }
    Ok(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_cover_every_connection_within_the_per_worker_cap() {
        let cases =
            [(5000, 8000, 2, 2), (15000, 8000, 2, 2), (20000, 8000, 2, 3), (1, 8000, 2, 1), (9, 8000, 6, 5)];
        for (conns, per, min, expect) in cases {
            let (n, each) = worker_split(conns, per, min);
            assert_eq!(n, expect, "{conns} conns, at most {per} each, at least {min} workers");
            assert!(n * each >= conns, "{conns} conns, {n} workers of {each}");
            assert!(each <= per, "{conns} conns: {each} per worker exceeds {per}");
            // No worker is left without a connection.
            assert!((n - 1) * each < conns, "{conns} conns: {n} workers of {each}");
        }
        assert_eq!(worker_split(0, 8000, 2), (1, 1));
    }

    #[test]
    fn source_addresses_count_up_within_loopback() {
        let base = Ipv4Addr::new(127, 0, 0, 2);
        assert_eq!(source_address(base, 0).unwrap(), base);
        assert_eq!(source_address(base, 300).unwrap(), Ipv4Addr::new(127, 0, 1, 46));
        assert!(source_address(Ipv4Addr::new(127, 255, 255, 250), 10).is_err());
    }
}
