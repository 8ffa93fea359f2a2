//! The `herald bench` command line.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// N connections, each subscribed to its own channel, held idle: server
    /// RSS per connection and idle CPU
    Idle,
    /// N subscribers on one channel, one HTTP publisher: deliveries/s and
    /// publish→deliver latency, at each `--rate`
    Fanout,
    /// N users each on their own `user:` channel, messages addressed to each
    P2p,
    /// Concurrent HTTP publishers with Idempotency-Keys: publishes/s and latency
    Publish,
    /// N subscribers dropped and reconnected with jitter while publishing:
    /// time until all resumed, nothing lost
    Reconnect,
    /// Herald only: N users' acked `user:` channels, every client acking:
    /// offline-inbox drain time, then live deliveries/s; acks/s throughout
    Acked,
    /// Herald only: M scheduled publishes (`deliver_at`) spread over
    /// `--spread`, starting `--lead` from now: each appended once, and the
    /// lateness (append ts - deliver_at) p50/p99
    Scheduled,
    /// Herald only: N connections spread round-robin over several nodes
    /// (`--targets`) on one Redis: connect, a broadcast, point-to-point
    /// traffic with one node killed (`--kill-node`) midway and its clients
    /// resumed on the others, then presence churn; per-node memory, Redis
    /// CPU and commands per message
    Cluster,
    /// Internal: one connection-holding worker process (spawned by the bench)
    #[value(hide = true)]
    Worker,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Idle => "idle",
            Scenario::Fanout => "fanout",
            Scenario::P2p => "p2p",
            Scenario::Publish => "publish",
            Scenario::Reconnect => "reconnect",
            Scenario::Acked => "acked",
            Scenario::Scheduled => "scheduled",
            Scenario::Cluster => "cluster",
            Scenario::Worker => "worker",
        }
    }
}

/// The server under test: Herald, or one of the peers in `bench/peers/`
/// spoken to through a thin protocol adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Peer {
    /// Herald (WebSocket `/ws`, HTTP API `/api/v1`)
    Herald,
    /// bench/peers/node/ws-server.js: Node `ws`, a Set per channel, HTTP publish
    Ws,
    /// bench/peers/node/socketio-server.js: Socket.IO 4.8 rooms, HTTP publish
    Socketio,
    /// bench/peers/socketioxide: the Rust Socket.IO server (axum), HTTP publish
    Socketioxide,
    /// nats-server with its WebSocket listener; HTTP-mode publishers use the
    /// TCP port, `--publish-via ws` publishers the WebSocket listener
    Nats,
    /// An HTTP server answering every POST with 201 and no deliveries
    /// (bench/lib.sh's `nginx-201`: the HTTP ceiling). `publish` only; the
    /// requests are Herald's publishes (path, body, Idempotency-Key), a
    /// publish counts when answered 201
    Http201,
}

impl Peer {
    pub fn name(self) -> &'static str {
        match self {
            Peer::Herald => "herald",
            Peer::Ws => "ws",
            Peer::Socketio => "socketio",
            Peer::Socketioxide => "socketioxide",
            Peer::Nats => "nats",
            Peer::Http201 => "http201",
        }
    }
}

/// Which of Herald's wires the subscribers speak (`--peer herald`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SubWire {
    /// Herald's JSON protocol on `/ws`
    Herald,
    /// Centrifugo's client protocol, JSON encoding, on
    /// `/connection/websocket` (centrifuge-js's and centrifuge-python's default)
    CentrifugoJson,
    /// Centrifugo's client protocol, Protobuf encoding, on
    /// `/connection/websocket` (the phone SDKs' wire)
    CentrifugoProtobuf,
    /// Server-Sent Events on `/sse` (read only: acked channels are not
    /// acknowledged)
    Sse,
}

impl SubWire {
    pub fn name(self) -> &'static str {
        match self {
            SubWire::Herald => "herald",
            SubWire::CentrifugoJson => "centrifugo-json",
            SubWire::CentrifugoProtobuf => "centrifugo-protobuf",
            SubWire::Sse => "sse",
        }
    }
}

/// How the fan-out and p2p publishers reach the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PublishVia {
    /// One request in flight per publisher: Herald's HTTP API, the peers'
    /// `POST /publish`, NATS `PUB` + `PING` on the client port
    Http,
    /// Pipelined WebSocket publishers: frames written back to back with at
    /// most `--window` unacknowledged publishes per connection
    Ws,
}

impl PublishVia {
    pub fn name(self) -> &'static str {
        match self {
            PublishVia::Http => "http",
            PublishVia::Ws => "ws",
        }
    }
}

/// One publishing pace: messages per second, or as fast as acknowledgements
/// come back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rate {
    PerSec(f64),
    Max,
}

impl Rate {
    pub fn label(self) -> String {
        match self {
            Rate::PerSec(r) => format!("{r}"),
            Rate::Max => "max".into(),
        }
    }

    /// Interval between two messages of one sequential publisher that has
    /// `share` of the total rate; `None` for max.
    pub fn interval(self, share: usize) -> Option<Duration> {
        match self {
            Rate::PerSec(r) => Some(Duration::from_secs_f64(share.max(1) as f64 / r)),
            Rate::Max => None,
        }
    }

    /// Interval between two messages of a sequential publisher that sends
    /// to `part` of `whole` equally served channels; `None` for max.
    pub fn interval_of(self, part: usize, whole: usize) -> Option<Duration> {
        match self {
            Rate::PerSec(r) => Some(Duration::from_secs_f64(whole.max(1) as f64 / (r * part.max(1) as f64))),
            Rate::Max => None,
        }
    }
}

/// `--rate 20,max` → `[PerSec(20), Max]`.
pub fn parse_rates(text: &str) -> anyhow::Result<Vec<Rate>> {
    let mut rates = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part.eq_ignore_ascii_case("max") {
            rates.push(Rate::Max);
            continue;
        }
        let r: f64 = part.parse().with_context(|| format!("--rate takes numbers or `max`, got `{part}`"))?;
        if !(r.is_finite() && r > 0.0) {
            bail!("--rate must be positive, got `{part}`");
        }
        rates.push(Rate::PerSec(r));
    }
    if rates.is_empty() {
        bail!("--rate is empty");
    }
    Ok(rates)
}

/// `herald bench SCENARIO --target http://HOST:PORT ...`
///
/// Every scenario is bounded in count (`--messages`, `--connections`) and in
/// time (`--timeout` per phase, `--hold`), verifies each delivery (arrived,
/// once, in order) and exits non-zero on any loss, duplicate or reorder.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Scenario to run
    #[arg(value_enum)]
    pub scenario: Scenario,
    /// Server address. For `--peer nats`: the WebSocket listener
    #[arg(long, env = "HERALD_URL", default_value = "http://127.0.0.1:8700")]
    pub target: String,
    /// Publish through this server instead of `--target`: a second Herald
    /// node on the same Redis, the other node of a NATS cluster (its
    /// WebSocket listener, with `--publish-via ws`), another Socket.IO
    /// process on the same Redis adapter. Subscribers stay on `--target`,
    /// so every delivery crosses nodes
    #[arg(long)]
    pub publish_target: Option<String>,
    /// cluster: every node's address, comma-separated; connection `i`
    /// opens on node `i % N`
    #[arg(long, value_delimiter = ',')]
    pub targets: Vec<String>,
    /// cluster: every node's process id, in `--targets` order (memory and
    /// CPU per node; the one `--kill-node` names is killed)
    #[arg(long, value_delimiter = ',')]
    pub server_pids: Vec<u32>,
    /// cluster: the nodes' Redis (HOST:PORT), read with `INFO` for its
    /// commands per message
    #[arg(long)]
    pub redis_addr: Option<String>,
    /// cluster: the redis-server process id, for its CPU
    #[arg(long)]
    pub redis_pid: Option<u32>,
    /// cluster: the node (index into `--targets`) killed with SIGKILL
    /// halfway through the point-to-point phase; its clients must resume
    /// on the others. None: no node is killed
    #[arg(long)]
    pub kill_node: Option<usize>,
    /// cluster: messages of the broadcast phase (one channel every
    /// connection subscribes to)
    #[arg(long, default_value_t = 20)]
    pub broadcast_messages: u64,
    /// cluster: broadcast messages per second
    #[arg(long, default_value_t = 2.0)]
    pub broadcast_rate: f64,
    /// cluster: presence churn clients (each joins and leaves a presence
    /// channel once per round)
    #[arg(long, default_value_t = 500)]
    pub churn_clients: usize,
    /// cluster: presence churn rounds
    #[arg(long, default_value_t = 4)]
    pub churn_rounds: u64,
    /// cluster: namespace of the presence channel (`presence = true`)
    #[arg(long, default_value = "presence")]
    pub presence_namespace: String,
    /// Server under test
    #[arg(long, value_enum, default_value_t = Peer::Herald)]
    pub peer: Peer,
    /// `--peer nats` only: the NATS client port publishers use (HOST:PORT)
    #[arg(long, default_value = "127.0.0.1:4223")]
    pub nats_publish: String,
    /// WebSocket connections (subscribers). Default: 1000 (reconnect: 500)
    #[arg(long)]
    pub connections: Option<usize>,
    /// Messages per rate phase (fanout), in total (p2p, publish, reconnect),
    /// per user and phase (acked; default 50)
    #[arg(long)]
    pub messages: Option<u64>,
    /// Publishing rate in messages/s, or `max`; comma-separated for several
    /// phases. Default: fanout `20,max`, reconnect `50`, others `max`
    #[arg(long)]
    pub rate: Option<String>,
    /// fanout: messages in each fixed-rate phase (default: `--messages`)
    #[arg(long)]
    pub paced_messages: Option<u64>,
    /// Message payload size in bytes (JSON with a timestamp, padded)
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Namespace of the bench channels. idle, p2p, acked: each user's own
    /// channel (default `user`, acked on Herald: the bench acks; `chat` is
    /// durable, `live` volatile; acked needs an acked one). fanout: the
    /// shared channel (default `chat`)
    #[arg(long)]
    pub namespace: Option<String>,
    /// fanout, p2p: publish over HTTP (one request in flight per publisher)
    /// or over pipelined WebSocket connections
    #[arg(long, value_enum, default_value_t = PublishVia::Http)]
    pub publish_via: PublishVia,
    /// `--peer herald`, fanout and p2p (and idle, `sse`): the wire the
    /// subscribers speak
    #[arg(long, value_enum, default_value_t = SubWire::Herald)]
    pub wire: SubWire,
    /// `--publish-via ws`: most unacknowledged publishes per connection
    #[arg(long, default_value_t = 1000)]
    pub window: usize,
    /// `--publish-via ws`: publishing connections (p2p shares the users
    /// between them; fanout needs exactly one)
    #[arg(long, default_value_t = 1)]
    pub ws_publishers: usize,
    /// Concurrent HTTP publishers (publish, p2p, acked). Default: 64 (p2p,
    /// acked: 32)
    #[arg(long)]
    pub publishers: Option<usize>,
    /// `publish`, Herald: messages per request, sent as one `POST
    /// /api/v1/messages` (1: one `POST /api/v1/channels/{channel}/messages`
    /// per message)
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Server process id, to read its RSS and CPU from /proc
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Client JWT for the WebSocket (its `channels` claim must allow the
    /// bench channels, e.g. `*`)
    #[arg(long, env = "HERALD_TOKEN", hide_env_values = true, conflicts_with = "dev")]
    pub token: Option<String>,
    /// API key for publishing over HTTP
    #[arg(long, env = "HERALD_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// The server runs with --dev: connect as `?user=NAME`, publish without a key
    #[arg(long)]
    pub dev: bool,
    /// Append one JSON object per run (or per rate phase, or per acked phase)
    /// to this file
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Free text stored in the JSON (e.g. a repetition id)
    #[arg(long)]
    pub label: Option<String>,
    /// idle: how long to hold the connections (CPU is measured over it;
    /// 30 s spans one heartbeat round of every server)
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub hold: Duration,
    /// scheduled: the delivery times are spread evenly over this window
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub spread: Duration,
    /// scheduled: the first delivery time is this long after the start
    /// (scheduling everything must fit in it for the lateness to be clean)
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub lead: Duration,
    /// Deadline of each phase (connect, deliver, reconnect)
    #[arg(long, value_parser = humantime::parse_duration, default_value = "120s")]
    pub timeout: Duration,
    /// reconnect: each client drops at a random time within this window;
    /// cluster: a client whose node went away waits a random time below
    /// this before it resumes on another
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub jitter: Duration,
    /// Connections per worker process at most (one process may open only so many files)
    #[arg(long, default_value_t = 8000)]
    pub conns_per_worker: usize,
    /// Worker processes at least (each one thread); 0: one per CPU core, so
    /// the subscriber side is not a single thread that the server outruns
    #[arg(long, default_value_t = 0)]
    pub workers: usize,
    /// First client source address; worker k binds to this + k
    #[arg(long, default_value = "127.0.0.2")]
    pub source_base: Ipv4Addr,
    /// Concurrent handshakes per worker while connecting
    #[arg(long, default_value_t = 64)]
    pub connect_concurrency: usize,
}

impl BenchArgs {
    pub fn connections(&self) -> usize {
        self.connections.unwrap_or(match self.scenario {
            Scenario::Reconnect => 500,
            _ => 1000,
        })
    }

    /// The namespace of the bench channels (see `--namespace`).
    pub fn namespace(&self) -> &str {
        match (&self.namespace, self.scenario) {
            (Some(ns), _) => ns,
            (None, Scenario::Fanout) => "chat",
            (None, _) => "user",
        }
    }

    pub fn rates(&self) -> anyhow::Result<Vec<Rate>> {
        let default = match self.scenario {
            Scenario::Fanout => "20,max",
            Scenario::Cluster => "10000",
            Scenario::Reconnect => "50",
            _ => "max",
        };
        parse_rates(self.rate.as_deref().unwrap_or(default))
    }

    pub fn publishers(&self) -> usize {
        self.publishers.unwrap_or(match self.scenario {
            Scenario::P2p | Scenario::Acked => 32,
            _ => 64,
        })
    }

    /// Check what can be checked before any connection is opened.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.peer == Peer::Herald && !self.dev && self.token.is_none() {
            bail!("give --dev (server started with --dev) or --token JWT and --api-key KEY");
        }
        if self.size < 48 {
            bail!("--size must be at least 48 bytes (the payload carries a sequence number and a timestamp)");
        }
        if self.size > 60_000 {
            bail!("--size must be at most 60000 bytes (below Herald's default message limit)");
        }
        if self.conns_per_worker == 0 || self.connect_concurrency == 0 {
            bail!("--conns-per-worker and --connect-concurrency must be positive");
        }
        if self.namespace().is_empty() || self.namespace().contains(':') {
            bail!("--namespace takes a namespace name without `:`, e.g. user or chat");
        }
        if self.publish_via == PublishVia::Ws {
            if !matches!(self.scenario, Scenario::Fanout | Scenario::P2p) {
                bail!("--publish-via ws applies to fanout and p2p only");
            }
            if self.window == 0 || self.ws_publishers == 0 {
                bail!("--window and --ws-publishers must be positive");
            }
            // Subscribers check the publisher's own sequence numbers, in
            // order: one channel needs one sequential publisher.
            if self.scenario == Scenario::Fanout && self.ws_publishers != 1 {
                bail!("fanout publishes to one channel: --ws-publishers must be 1");
            }
        }
        if self.wire != SubWire::Herald
            && (self.peer != Peer::Herald || !matches!(self.scenario, Scenario::Fanout | Scenario::P2p))
            && !(self.wire == SubWire::Sse && self.peer == Peer::Herald && self.scenario == Scenario::Idle)
        {
            bail!("--wire applies to `--peer herald` fanout and p2p subscribers (and `--wire sse` to idle)");
        }
        if let Some(url) = &self.publish_target {
            if url_authority(url).is_none() {
                bail!("--publish-target needs a host and port, e.g. http://127.0.0.1:8701");
            }
            if self.peer == Peer::Nats && self.publish_via == PublishVia::Http {
                bail!("`--peer nats` HTTP publishers use --nats-publish, not --publish-target");
            }
        }
        if self.peer == Peer::Http201 && self.scenario != Scenario::Publish {
            bail!("`--peer http201` answers publishes only: it runs the `publish` scenario");
        }
        if self.batch == 0 || self.batch > 1000 {
            bail!("--batch takes 1 to 1000 messages per request");
        }
        if self.batch > 1 && (self.scenario != Scenario::Publish || self.peer != Peer::Herald) {
            bail!("--batch applies to the `publish` scenario against Herald");
        }
        if self.scenario == Scenario::Scheduled && self.peer != Peer::Herald {
            bail!("`scheduled` runs against Herald only: the peers have no scheduled delivery");
        }
        if self.scenario == Scenario::Cluster {
            if self.peer != Peer::Herald {
                bail!("`cluster` runs against Herald only");
            }
            if self.targets.is_empty() {
                bail!("`cluster` needs --targets (every node's address)");
            }
            if !self.server_pids.is_empty() && self.server_pids.len() != self.targets.len() {
                bail!("--server-pids must name one process per --targets entry");
            }
            if let Some(k) = self.kill_node {
                if k >= self.targets.len() || self.targets.len() < 2 {
                    bail!("--kill-node {k}: needs at least 2 nodes and an index into --targets");
                }
                if self.server_pids.is_empty() {
                    bail!("--kill-node needs --server-pids");
                }
            }
            if !(self.broadcast_rate.is_finite() && self.broadcast_rate > 0.0) {
                bail!("--broadcast-rate must be positive");
            }
            if !matches!(self.rates()?.as_slice(), [Rate::PerSec(_)]) {
                bail!("`cluster` needs one paced --rate (messages/s) so the kill lands midway");
            }
        }
        if self.scenario == Scenario::Acked && self.peer != Peer::Herald {
            bail!("`acked` runs against Herald only: the peers have no acked delivery");
        }
        if self.publishers() == 0 {
            bail!("--publishers must be positive");
        }
        self.rates()?;
        Ok(())
    }
}

/// `http://host:port[/...]` (or `host:port`) → `host:port`; `None` when
/// there is no host.
pub fn url_authority(url: &str) -> Option<&str> {
    let t = url.trim();
    let rest = t.split_once("://").map_or(t, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or(rest);
    (!authority.is_empty() && !authority.starts_with(':')).then_some(authority)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_lists_and_max() {
        assert_eq!(parse_rates("20,max").unwrap(), vec![Rate::PerSec(20.0), Rate::Max]);
        assert_eq!(parse_rates(" MAX ").unwrap(), vec![Rate::Max]);
        assert!(parse_rates("0").is_err());
        assert!(parse_rates("fast").is_err());
        assert!(parse_rates(",").is_err());
    }

    fn parse(argv: &[&str]) -> BenchArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: BenchArgs,
        }
        <Cli as clap::Parser>::try_parse_from(std::iter::once("bench").chain(argv.iter().copied()))
            .expect("arguments parse")
            .args
    }

    #[test]
    fn acked_is_herald_only_and_defaults_to_32_publishers() {
        let a = parse(&["acked", "--token", "t"]);
        assert!(a.validate().is_ok());
        assert_eq!((a.connections(), a.publishers(), a.rates().unwrap()), (1000, 32, vec![Rate::Max]));
        assert!(parse(&["acked", "--peer", "ws"]).validate().is_err());
    }

    #[test]
    fn ws_publishing_is_for_fanout_and_p2p_with_one_fanout_publisher() {
        let p2p =
            parse(&["p2p", "--dev", "--publish-via", "ws", "--ws-publishers", "4", "--namespace", "live"]);
        assert!(p2p.validate().is_ok());
        assert_eq!((p2p.window, p2p.ws_publishers, p2p.namespace()), (1000, 4, "live"));
        assert!(parse(&["fanout", "--dev", "--publish-via", "ws"]).validate().is_ok());
        assert!(parse(&["fanout", "--dev", "--publish-via", "ws", "--ws-publishers", "2"])
            .validate()
            .is_err());
        assert!(parse(&["publish", "--dev", "--publish-via", "ws"]).validate().is_err());
        assert!(parse(&["p2p", "--dev", "--publish-via", "ws", "--window", "0"]).validate().is_err());
        let http = parse(&["p2p", "--dev"]);
        assert_eq!((http.publish_via, http.namespace()), (PublishVia::Http, "user"));
    }

    #[test]
    fn ws_publishers_may_publish_through_another_node() {
        let a = parse(&[
            "p2p",
            "--dev",
            "--publish-via",
            "ws",
            "--target",
            "http://127.0.0.1:18701",
            "--publish-target",
            "http://127.0.0.1:18700",
        ]);
        assert!(a.validate().is_ok());
        assert_eq!(a.publish_target.as_deref(), Some("http://127.0.0.1:18700"));
        let nats = ["fanout", "--peer", "nats", "--publish-target", "http://127.0.0.1:4281"];
        assert!(parse(&[&nats[..], &["--publish-via", "ws"]].concat()).validate().is_ok());
        // NATS HTTP-mode publishers use the client port (--nats-publish).
        assert!(parse(&nats).validate().is_err());
        assert!(parse(&["p2p", "--dev", "--publish-via", "ws", "--publish-target", "http://"])
            .validate()
            .is_err());
    }

    #[test]
    fn batch_applies_to_herald_publish_only() {
        assert!(parse(&["publish", "--dev", "--batch", "100"]).validate().is_ok());
        assert!(parse(&["publish", "--dev", "--batch", "0"]).validate().is_err());
        assert!(parse(&["publish", "--dev", "--batch", "1001"]).validate().is_err());
        assert!(parse(&["p2p", "--dev", "--batch", "100"]).validate().is_err());
        assert!(parse(&["publish", "--peer", "http201", "--batch", "100"]).validate().is_err());
    }

    #[test]
    fn http201_runs_the_publish_scenario_only() {
        assert!(parse(&["publish", "--peer", "http201"]).validate().is_ok());
        assert!(parse(&["p2p", "--peer", "http201"]).validate().is_err());
        assert!(parse(&["fanout", "--peer", "http201", "--publish-via", "ws"]).validate().is_err());
        assert_eq!(Peer::Http201.name(), "http201");
    }

    #[test]
    fn url_authority_is_host_and_port() {
        assert_eq!(url_authority("http://127.0.0.1:8700/ws"), Some("127.0.0.1:8700"));
        assert_eq!(url_authority(" 127.0.0.1:4281 "), Some("127.0.0.1:4281"));
        assert_eq!(url_authority("ws://localhost"), Some("localhost"));
        assert_eq!(url_authority("http://"), None);
        assert_eq!(url_authority("http://:80"), None);
    }

    #[test]
    fn cluster_needs_targets_a_pid_per_node_and_a_paced_rate() {
        let ok = parse(&["cluster", "--dev", "--targets", "http://a:1,http://b:2", "--server-pids", "7,8"]);
        assert!(ok.validate().is_ok());
        assert_eq!((ok.targets.len(), ok.rates().unwrap()), (2, vec![Rate::PerSec(10000.0)]));
        assert!(parse(&["cluster", "--dev"]).validate().is_err());
        assert!(parse(&["cluster", "--dev", "--targets", "http://a:1,http://b:2", "--server-pids", "7"])
            .validate()
            .is_err());
        let kill = ["cluster", "--dev", "--targets", "http://a:1,http://b:2", "--server-pids", "7,8"];
        assert!(parse(&[&kill[..], &["--kill-node", "1"]].concat()).validate().is_ok());
        assert!(parse(&[&kill[..], &["--kill-node", "2"]].concat()).validate().is_err());
        assert!(parse(&[&kill[..], &["--rate", "max"]].concat()).validate().is_err());
    }

    #[test]
    fn fanout_defaults_to_chat_and_others_to_user() {
        assert_eq!(parse(&["fanout", "--dev"]).namespace(), "chat");
        assert_eq!(parse(&["idle", "--dev"]).namespace(), "user");
        assert_eq!(parse(&["fanout", "--dev", "--namespace", "live"]).namespace(), "live");
        assert!(parse(&["fanout", "--dev", "--namespace", "chat:x"]).validate().is_err());
    }

    #[test]
    fn interval_splits_the_rate_between_publishers() {
        assert_eq!(Rate::PerSec(100.0).interval(1), Some(Duration::from_millis(10)));
        assert_eq!(Rate::PerSec(100.0).interval(4), Some(Duration::from_millis(40)));
        assert_eq!(Rate::Max.interval(4), None);
        // 3 of 10 channels at 100/s in all: 30/s for this publisher.
        let iv = Rate::PerSec(100.0).interval_of(3, 10).unwrap();
        assert!((iv.as_secs_f64() - 1.0 / 30.0).abs() < 1e-9);
        assert_eq!(Rate::Max.interval_of(3, 10), None);
    }
}
