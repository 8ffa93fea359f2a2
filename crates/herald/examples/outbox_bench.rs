//! The outbox consumer's figures (bench/outbox.sh runs it): rows per
//! second from commit to subscriber, and the latency from `COMMIT` to
//! delivery at a fixed rate, for each engine and partition count.
//!
//!   cargo run --release --example outbox_bench -- HERALD_BINARY
//!
//! Sizes from the environment: ROWS (10000, the throughput run), CHANNELS
//! (50), WRITERS (8, each committing transactions of 10 rows), RATE (1000
//! rows/s) and LATENCY_ROWS (5000) for the latency run. Each run starts its
//! own PostgreSQL (and redis-server for the Redis engine) and Herald node;
//! every row is checked to arrive once.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herald_client::{Client, ClientOptions, ConnectOptions, Event};
use herald_test_support::{postgres_connect, HeraldProcess, PostgresServer, RedisServer};

const DDL: &str = "
CREATE TABLE herald_outbox (id bigserial PRIMARY KEY, channel text NOT NULL, data jsonb NOT NULL,
    meta jsonb, idempotency_key text, created_at timestamptz NOT NULL DEFAULT now());
CREATE FUNCTION herald_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_notify('herald_outbox', ''); RETURN NULL; END $$;
CREATE TRIGGER herald_outbox_notify AFTER INSERT ON herald_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION herald_outbox_notify();";

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Arrival time of each tag.
type Arrivals = Arc<Mutex<HashMap<String, Instant>>>;

struct Run {
    _pg: PostgresServer,
    _redis: Option<RedisServer>,
    _herald: HeraldProcess,
    _client: Client,
    dsn: String,
    arrivals: Arrivals,
    _dir: tempfile::TempDir,
}

async fn start(herald: &str, engine: &str, partitions: u32, channels: usize) -> Run {
    let pg = PostgresServer::start();
    postgres_connect(&pg.dsn()).await.batch_execute(DDL).await.expect("DDL");
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = (engine == "redis").then(RedisServer::start);
    // Top-level keys first, then the tables.
    let (top, redis_table) = match &redis {
        Some(r) => ("engine = \"redis\"".to_owned(), format!("[redis]\nurl = \"{}\"\n", r.url())),
        None => (format!("engine = \"embedded\"\ndata_dir = {:?}", dir.path().join("data")), String::new()),
    };
    let config = format!(
        "dev = true\n{top}\n\n{redis_table}\n[[consumers]]\nname = \"bench\"\nkind = \"postgres\"\ndsn = \"{}\"\npartitions = {partitions}\nbatch_size = 500\n\n[namespaces.orders]\ndelivery = \"durable\"\n",
        pg.dsn()
    );
    let path = dir.path().join("herald.toml");
    std::fs::write(&path, config).expect("write config");
    let mut cmd = Command::new(herald);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&path)
        .env("HERALD_LOG", "error")
        .stderr(Stdio::inherit());
    let process = HeraldProcess::spawn(&mut cmd, None);
    let client = Client::new(ClientOptions::new(ConnectOptions::dev_user(&process.url, "bench")));
    let arrivals: Arrivals = Arc::default();
    for c in 0..channels {
        let mut sub = client.subscribe(&format!("orders:{c}"), None).await.expect("subscribe");
        let arrivals = arrivals.clone();
        tokio::spawn(async move {
            while let Some(Ok(Event::Message(m))) = sub.next().await {
                let v: serde_json::Value = serde_json::from_str(m.data.get()).expect("json");
                let tag = v["t"].as_str().unwrap_or_default().to_owned();
                assert!(
                    arrivals.lock().unwrap().insert(tag.clone(), Instant::now()).is_none(),
                    "{tag} twice"
                );
            }
        });
    }
    Run { dsn: pg.dsn(), _pg: pg, _redis: redis, _herald: process, _client: client, arrivals, _dir: dir }
}

async fn wait_all(arrivals: &Arrivals, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while arrivals.lock().unwrap().len() < n {
        assert!(Instant::now() < deadline, "{} of {n} rows arrived", arrivals.lock().unwrap().len());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// ROWS rows from WRITERS connections in transactions of 10: rows/s from
/// the first commit to the last arrival.
async fn throughput(run: &Run, rows: usize, writers: usize, channels: usize) -> f64 {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let dsn = run.dsn.clone();
        tasks.push(tokio::spawn(async move {
            let mut pg = postgres_connect(&dsn).await;
            let mine = rows / writers;
            for t in 0..mine.div_ceil(10) {
                let tx = pg.transaction().await.expect("begin");
                for r in 0..10.min(mine - t * 10) {
                    let tag = format!("{w}-{t}-{r}");
                    let data = format!("{{\"t\":\"{tag}\"}}");
                    let channel = format!("orders:{}", fastrand::usize(..channels));
                    tx.execute(
                        "INSERT INTO herald_outbox (channel, data) VALUES ($1, $2::text::jsonb)",
                        &[&channel, &data],
                    )
                    .await
                    .expect("insert");
                }
                tx.commit().await.expect("commit");
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer");
    }
    let total = (rows / writers) * writers;
    wait_all(&run.arrivals, total).await;
    total as f64 / started.elapsed().as_secs_f64()
}

/// LATENCY_ROWS single-row transactions at RATE rows/s from one
/// connection: COMMIT returned -> the subscriber has it, p50 and p99 (ms).
async fn latency(run: &Run, rows: usize, rate: usize, channels: usize) -> (f64, f64) {
    let pg = postgres_connect(&run.dsn).await;
    let mut committed = HashMap::new();
    let start = Instant::now();
    let base = run.arrivals.lock().unwrap().len();
    for i in 0..rows {
        let due = start + Duration::from_secs_f64(i as f64 / rate as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
        let tag = format!("l-{i}");
        let data = format!("{{\"t\":\"{tag}\"}}");
        let channel = format!("orders:{}", i % channels);
        pg.execute(
            "INSERT INTO herald_outbox (channel, data) VALUES ($1, $2::text::jsonb)",
            &[&channel, &data],
        )
        .await
        .expect("insert");
        committed.insert(tag, Instant::now());
    }
    wait_all(&run.arrivals, base + rows).await;
    let arrivals = run.arrivals.lock().unwrap();
    let mut ms: Vec<f64> = committed
        .iter()
        .map(|(tag, at)| arrivals[tag].saturating_duration_since(*at).as_secs_f64() * 1000.0)
        .collect();
    ms.sort_by(f64::total_cmp);
    let q = |p: f64| ms[((ms.len() as f64 * p) as usize).min(ms.len() - 1)];
    (q(0.50), q(0.99))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let herald = std::env::args().nth(1).expect("usage: outbox_bench HERALD_BINARY");
    let (rows, channels, writers) = (env("ROWS", 10_000), env("CHANNELS", 50), env("WRITERS", 8));
    let (rate, latency_rows) = (env("RATE", 1000), env("LATENCY_ROWS", 5000));
    println!("| engine | partitions | rows/s commit -> subscriber ({rows} rows, {writers} writers, {channels} channels) | COMMIT -> delivery p50 / p99 at {rate} rows/s |");
    println!("|---|---|---|---|");
    for engine in ["embedded", "redis"] {
        for partitions in [1, 8] {
            let run = start(&herald, engine, partitions, channels).await;
            let per_sec = throughput(&run, rows, writers, channels).await;
            let (p50, p99) = latency(&run, latency_rows, rate, channels).await;
            println!("| {engine} | {partitions} | {per_sec:.0} | {p50:.1} ms / {p99:.1} ms |");
        }
    }
}
