//! The scenarios, and what they share: the target endpoint, the run id,
//! the fleet plan and report, the measured window, the publisher loops and
//! the worker lifetime bound.

mod acked;
mod cluster;
mod fanout;
mod idle;
mod p2p;
mod publish;
mod reconnect;
mod scheduled;

use std::time::Duration;

use anyhow::{bail, Context};
use tokio::time::Instant;

use crate::args::{url_authority, BenchArgs, Peer, Rate, Scenario};
use crate::fleet::{Fleet, FleetPlan};
use crate::hist::Histogram;
use crate::payload;
use crate::pipelined::{PipelinePlan, PipelineStats, WsPublisher};
use crate::proc_stats::CpuSnapshot;
use crate::protocol::{Endpoint, WsAuth};
use crate::publisher::{Ack, Publisher, PublisherFactory};
use crate::report::{round2, Report};
use crate::tally::Tally;
use crate::worker::wire::Layout;

/// How long a cross-node run waits between the last subscription and the
/// first publish (see [`Ctx::settle_cross_node`]).
const CROSS_NODE_SETTLE: Duration = Duration::from_secs(1);

/// What every scenario starts from.
pub struct Ctx<'a> {
    pub args: &'a BenchArgs,
    pub run_id: String,
    /// Where the subscribers connect (`--target`).
    pub endpoint: Endpoint,
    /// Where pipelined publishers connect: `--publish-target` if given,
    /// else `--target`.
    pub publish_endpoint: Endpoint,
    pub publishers: PublisherFactory,
}

impl Ctx<'_> {
    pub fn report(&self) -> Report {
        Report::new(self.args, &self.run_id)
    }

    /// The report of a run of `fleet` (`--connections` subscribers) that
    /// publishes `messages` of `--size` bytes at `rate`.
    pub fn fleet_report(&self, fleet: &Fleet, messages: u64, rate: Rate) -> Report {
        let mut report = self.report();
        report.connections = self.args.connections() as u64;
        report.workers = fleet.len() as u64;
        report.messages = Some(messages);
        report.rate = Some(rate.label());
        report.size = Some(self.args.size as u64);
        report
    }

    /// The fleet of `--connections` subscribers to this run's endpoint.
    pub fn fleet_plan(&self, layout: Layout, resume: bool, lifetime: Duration) -> FleetPlan {
        FleetPlan {
            endpoints: vec![self.endpoint.clone()],
            run_id: self.run_id.clone(),
            connections: self.args.connections(),
            layout,
            resume,
            resume_jitter: Duration::ZERO,
            lifetime,
        }
    }

    /// A bound on how long worker processes may live: every phase timeout
    /// plus the planned publishing and holding time, plus a margin.
    /// Whether publishes enter on another node than the subscribers'.
    pub fn cross_node(&self) -> bool {
        self.args.publish_target.is_some()
    }

    /// Before the first publish of a cross-node run: a subscription
    /// confirmed by the subscribers' node may not yet be known to the
    /// publishers' node (a NATS route propagates interest after the
    /// `PONG`), and what is published meanwhile is not routed to it.
    /// Outside the measured part.
    pub async fn settle_cross_node(&self) {
        if self.cross_node() {
            tokio::time::sleep(CROSS_NODE_SETTLE).await;
        }
    }

    pub fn lifetime(&self, phases: u32, planned: Duration) -> Duration {
        self.args.timeout * (2 * phases + 2)
            + self.args.hold
            + self.args.jitter
            + planned
            + Duration::from_secs(60)
    }
}

/// Run the scenario named in `args`; every report is printed and appended
/// to `--json`. Fails if any report failed.
pub async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    args.validate()?;
    crate::proc_stats::raise_nofile();
    let endpoint = endpoint(args, &args.target).await?;
    let publish_endpoint = match &args.publish_target {
        Some(url) => self::endpoint(args, url).await?,
        None => endpoint.clone(),
    };
    let ctx = Ctx {
        args,
        run_id: format!("b{:08x}", fastrand::u32(..)),
        endpoint,
        publish_endpoint,
        publishers: PublisherFactory::new(args)?,
    };
    let server_version = server_version(args).await;
    let reports = match args.scenario {
        Scenario::Idle => vec![idle::run(&ctx).await?],
        Scenario::Fanout => fanout::run(&ctx).await?,
        Scenario::P2p => vec![p2p::run(&ctx).await?],
        Scenario::Publish => vec![publish::run(&ctx).await?],
        Scenario::Reconnect => vec![reconnect::run(&ctx).await?],
        Scenario::Acked => acked::run(&ctx).await?,
        Scenario::Scheduled => vec![scheduled::run(&ctx).await?],
        Scenario::Cluster => cluster::run(&ctx).await?,
        Scenario::Worker => bail!("`worker` is internal: the bench starts it itself"),
    };
    let mut failed = 0;
    for mut r in reports {
        r.versions.server = server_version.clone();
        r.emit(args.json.as_deref())?;
        failed += usize::from(!r.ok);
    }
    if failed > 0 {
        bail!("{failed} run(s) FAILED verification (see above)");
    }
    Ok(())
}

/// `url` (`http://host:port[/...]`) → where the sockets connect.
pub(crate) async fn endpoint(args: &BenchArgs, url: &str) -> anyhow::Result<Endpoint> {
    let Some(authority) = url_authority(url).map(str::to_owned) else {
        bail!("{url}: needs a host and port, e.g. http://127.0.0.1:8700");
    };
    let with_port = if authority.contains(':') { authority.clone() } else { format!("{authority}:80") };
    let addr = tokio::net::lookup_host(&with_port)
        .await
        .with_context(|| format!("cannot resolve {with_port}"))?
        .find(std::net::SocketAddr::is_ipv4)
        .with_context(|| format!("{with_port} has no IPv4 address"))?;
    let auth = match &args.token {
        Some(token) => WsAuth::Token(token.clone()),
        None => WsAuth::Dev,
    };
    Ok(Endpoint { peer: args.peer, addr, authority, auth, wire: args.wire })
}

/// The peer servers in bench/peers answer `GET /version`; NATS says it in
/// its INFO line. Best effort.
async fn server_version(args: &BenchArgs) -> Option<String> {
    match args.peer {
        Peer::Herald => None,
        Peer::Ws | Peer::Socketio | Peer::Socketioxide | Peer::Http201 => {
            let client =
                reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(5)).build().ok()?;
            let url = format!("{}/version", args.target.trim_end_matches('/'));
            let resp = client.get(url).send().await.ok()?;
            resp.text().await.ok().map(|t| t.trim().to_owned())
        }
        Peer::Nats => crate::publisher::nats_version(&args.nats_publish).await.ok(),
    }
}

/// What a publishing loop did.
#[derive(Default)]
pub struct PublishStats {
    pub published: u64,
    /// Request → acknowledgement time, µs.
    pub latency: Histogram,
    pub acks: Vec<Ack>,
    pub elapsed: Duration,
    pub error: Option<String>,
}

/// What one sequential publisher sends: for each round `n` in
/// `n0..n0 + rounds`, one message to each of `channels` in turn, paced
/// `interval` apart (`None`: as fast as acknowledgements come), until
/// `deadline`.
pub struct PublishPlan<'a> {
    pub channels: &'a [String],
    pub n0: u64,
    pub rounds: u64,
    pub size: usize,
    pub interval: Option<Duration>,
    pub deadline: Instant,
    /// Keep the server's answers for verification.
    pub keep_acks: bool,
    /// Send an `Idempotency-Key` (`{channel}/{n}`) with each publish.
    pub idempotency_keys: bool,
}

/// Run a [`PublishPlan`]; stops at the first failure or at the deadline.
pub async fn publish_loop(publisher: &mut Publisher, plan: PublishPlan<'_>) -> PublishStats {
    let mut stats = PublishStats::default();
    let start = Instant::now();
    let mut k = 0u32;
    'outer: for n in plan.n0..plan.n0 + plan.rounds {
        for channel in plan.channels {
            if let Some(iv) = plan.interval {
                tokio::time::sleep_until(start + iv * k).await;
            }
            k = k.saturating_add(1);
            if Instant::now() >= plan.deadline {
                stats.error =
                    Some(format!("publishing did not finish before the deadline ({} sent)", stats.published));
                break 'outer;
            }
            let body = payload::encode(n, plan.size);
            let key = plan.idempotency_keys.then(|| idempotency_key(channel, n));
            let sent = Instant::now();
            match publisher.publish(channel, body, key.as_deref()).await {
                Ok(ack) => {
                    stats.latency.record(sent.elapsed().as_micros() as u64);
                    stats.published += 1;
                    if plan.keep_acks {
                        stats.acks.push(ack);
                    }
                }
                Err(e) => {
                    stats.error = Some(format!("publish to {channel} (n={n}) failed: {e:#}"));
                    break 'outer;
                }
            }
        }
    }
    stats.elapsed = start.elapsed();
    stats
}

/// What [`publish_per_user`] did, over all its publishers.
pub struct Publishing {
    pub published: u64,
    /// Request → acknowledgement time, µs.
    pub latency: Histogram,
    pub errors: Vec<String>,
    pub elapsed: Duration,
}

/// Rounds `n0..n0 + rounds` to each of `channels` from `publishers`
/// concurrent sequential publishers sharing `rate`. Channel `i` belongs to
/// publisher `i % publishers`, so each channel has a single sequential
/// publisher and its order is well defined.
pub async fn publish_per_user(
    ctx: &Ctx<'_>,
    channels: &[String],
    (n0, rounds): (u64, u64),
    rate: Rate,
    publishers: usize,
    idempotency_keys: bool,
    deadline: Instant,
) -> anyhow::Result<Publishing> {
    let publishers = publishers.clamp(1, channels.len().max(1));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(publishers);
    for p in 0..publishers {
        let mine: Vec<String> = channels.iter().skip(p).step_by(publishers).cloned().collect();
        let factory = ctx.publishers.clone();
        // Publishers may serve different numbers of channels: pace each by
        // its share, so every channel gets the same rate.
        let (size, interval) = (ctx.args.size, rate.interval_of(mine.len(), channels.len()));
        tasks.push(tokio::spawn(async move {
            let mut publisher = factory.connect().await?;
            let plan = PublishPlan {
                channels: &mine,
                n0,
                rounds,
                size,
                interval,
                deadline,
                keep_acks: false,
                idempotency_keys,
            };
            anyhow::Ok(publish_loop(&mut publisher, plan).await)
        }));
    }
    let mut out = Publishing {
        published: 0,
        latency: Histogram::default(),
        errors: Vec::new(),
        elapsed: Duration::ZERO,
    };
    for t in tasks {
        match t.await.context("publisher task panicked")? {
            Ok(stats) => {
                out.published += stats.published;
                out.latency.merge(&stats.latency);
                out.errors.extend(stats.error);
            }
            Err(e) => out.errors.push(format!("publisher: {e:#}")),
        }
    }
    out.elapsed = started.elapsed();
    Ok(out)
}

/// Open one pipelined publishing connection (`--publish-via ws`) to the
/// publish endpoint; its user name `{run_id}-pub{k}` keeps it apart from
/// the subscribers.
pub async fn ws_publisher(ctx: &Ctx<'_>, k: usize) -> anyhow::Result<WsPublisher> {
    WsPublisher::connect(&ctx.publish_endpoint, &format!("{}-pub{k}", ctx.run_id)).await
}

/// Rounds `n0..n0 + rounds` to each of `channels` from `connections`
/// pipelined publishers (`--publish-via ws`) on the publish endpoint
/// (`--publish-target`, else the target) sharing `rate`. Channel `i`
/// belongs to connection `i % connections`, so each channel has a single
/// sequential publisher. The connections run concurrently in this task.
pub async fn publish_pipelined(
    ctx: &Ctx<'_>,
    channels: &[String],
    (n0, rounds): (u64, u64),
    rate: Rate,
    connections: usize,
    deadline: Instant,
) -> PipelineStats {
    let connections = connections.clamp(1, channels.len().max(1));
    publish_pipelined_on(
        ctx,
        &vec![ctx.publish_endpoint.clone(); connections],
        channels,
        (n0, rounds),
        rate,
        deadline,
    )
    .await
}

/// [`publish_pipelined`] with publishing connection `k` on `endpoints[k]`
/// (one connection per entry): a cluster's publishers on several nodes.
pub async fn publish_pipelined_on(
    ctx: &Ctx<'_>,
    endpoints: &[Endpoint],
    channels: &[String],
    (n0, rounds): (u64, u64),
    rate: Rate,
    deadline: Instant,
) -> PipelineStats {
    let connections = endpoints.len().clamp(1, channels.len().max(1));
    let mut stats = PipelineStats::default();
    let mut publishers = Vec::with_capacity(connections);
    for (k, ep) in endpoints.iter().take(connections).enumerate() {
        match WsPublisher::connect(ep, &format!("{}-pub{k}", ctx.run_id)).await {
            Ok(p) => publishers.push(p),
            Err(e) => {
                stats.errors.push(format!("publisher {k}: {e:#}"));
                return stats;
            }
        }
    }
    let lanes = publishers.iter_mut().enumerate().map(|(k, publisher)| {
        let mine: Vec<String> =
            channels.iter().skip(k).step_by(connections).map(|c| publisher.target(c)).collect();
        let interval = rate.interval_of(mine.len(), channels.len());
        let window = ctx.args.window;
        let size = ctx.args.size;
        async move {
            publisher.run(PipelinePlan { targets: &mine, n0, rounds, size, interval, window, deadline }).await
        }
    });
    for lane in futures_util::future::join_all(lanes).await {
        stats.merge(&lane);
    }
    for p in publishers {
        p.close().await;
    }
    stats
}

/// The `Idempotency-Key` of message `n` to `channel` (channel names carry
/// the run id, so keys are unique to the run).
pub fn idempotency_key(channel: &str, n: u64) -> String {
    format!("{channel}/{n}")
}

/// The start of a measured run: the CPU snapshot and the clocks its
/// duration and deliveries/s count from.
pub struct Measured {
    w0: CpuSnapshot,
    start_us: u64,
    pub started: Instant,
}

impl Measured {
    pub fn start(args: &BenchArgs, fleet: &Fleet) -> anyhow::Result<Self> {
        let w0 = CpuSnapshot::take(args.server_pid, fleet.client_sample())?;
        Ok(Measured { w0, start_us: payload::now_micros(), started: Instant::now() })
    }

    /// The end of the run, `w1` taken after its deliveries were collected:
    /// its duration (to now), tally, CPU window and deliveries/s.
    pub fn finish(&self, report: &mut Report, w1: &CpuSnapshot, tally: &Tally) {
        report.duration_s = round2(self.started.elapsed().as_secs_f64());
        report.apply_tally(tally);
        report.apply_window(&self.w0, w1);
        report.deliveries_per_s = per_second(tally.delivered, self.start_us, tally.last_rx_us);
    }
}

/// Deliveries per second over `[start_us, last_rx_us]`.
pub fn per_second(count: u64, start_us: u64, last_us: Option<u64>) -> Option<f64> {
    let last = last_us?;
    let secs = last.saturating_sub(start_us) as f64 / 1e6;
    (secs > 0.0 && count > 0).then(|| (count as f64 / secs).round())
}

/// Messages a user gets when `total` are spread over `users`.
pub fn per_user(total: u64, users: usize) -> u64 {
    total.div_ceil(users.max(1) as u64).max(1)
}
