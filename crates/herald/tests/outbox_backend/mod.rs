//! What the outbox consumer tests share: the table's DDL and trigger, a
//! backend writing rows in transactions (some rolled back), subscribers
//! that keep every delivery, `herald serve` processes with a consumer, and
//! the checker.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_client::{Backoff, Client, ClientOptions, ConnectOptions, Event};
use herald_test_support::{eventually, HeraldProcess};
use tokio::sync::RwLock;

pub const API_KEY: &str = "outbox-test-api-key-0123456789";
pub const WAIT: Duration = Duration::from_secs(60);

/// The table of the documented contract, its `NOTIFY` trigger.
pub const DDL: &str = "
CREATE TABLE herald_outbox (
    id bigserial PRIMARY KEY,
    channel text NOT NULL,
    data jsonb NOT NULL,
    meta jsonb,
    idempotency_key text,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE FUNCTION herald_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('herald_outbox', '');
    RETURN NULL;
END $$;
CREATE TRIGGER herald_outbox_notify AFTER INSERT ON herald_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION herald_outbox_notify();
";

/// A `herald serve` on `port` (0: any) with `config` (engine lines and
/// `[[consumers]]`), dev mode, the `orders` namespace durable.
pub fn spawn_herald(port: u16, config: &str, dir: &std::path::Path) -> HeraldProcess {
    let text = format!(
        "dev = true\napi_keys = [\"{API_KEY}\"]\n{config}\n\n[namespaces.orders]\ndelivery = \"durable\"\n"
    );
    let path = dir.join("herald.toml");
    std::fs::write(&path, text).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
    cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--config"])
        .arg(&path)
        .env("HERALD_LOG", std::env::var("HERALD_TEST_LOG").unwrap_or_else(|_| "warn".into()))
        .stderr(Stdio::inherit());
    HeraldProcess::spawn(&mut cmd, None)
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A committed row: its id, channel and tag (the `data.tag` it carries).
#[derive(Debug, Clone)]
pub struct Committed {
    pub id: i64,
    pub channel: String,
    pub tag: String,
}

/// What the backend wrote.
#[derive(Default)]
pub struct Ledger {
    pub committed: Vec<Committed>,
    pub rolled_back: HashSet<String>,
    /// Tags of rows that must be parked, never delivered.
    pub poisoned: HashSet<String>,
}

/// Writers hold `gate` for reading during each transaction: a test takes
/// it for writing to restart PostgreSQL with no transaction in flight, so
/// every commit's outcome is known.
pub struct Backend {
    pub ledger: Arc<Mutex<Ledger>>,
    pub gate: Arc<RwLock<()>>,
}

impl Backend {
    pub fn new() -> Self {
        Backend { ledger: Arc::default(), gate: Arc::new(RwLock::new(())) }
    }

    pub fn committed(&self) -> usize {
        self.ledger.lock().unwrap().committed.len()
    }

    /// Spawn `writers` tasks, each writing `rows` rows in transactions of
    /// 1..=5 rows over `channels`; one transaction in six is rolled back.
    /// With `poison`, writer 0 also commits two rows that cannot be
    /// published (an unknown namespace, a `meta` that is not strings).
    pub fn spawn_writers(
        &self,
        dsn: &str,
        writers: usize,
        rows: usize,
        channels: usize,
        pause: Duration,
        poison: bool,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        (0..writers)
            .map(|w| {
                let (dsn, ledger, gate) = (dsn.to_owned(), self.ledger.clone(), self.gate.clone());
                tokio::spawn(async move {
                    let mut client = herald_test_support::postgres_connect(&dsn).await;
                    let mut written = 0;
                    let mut t = 0;
                    while written < rows {
                        t += 1;
                        let _held = gate.read().await;
                        if client.is_closed() {
                            client = herald_test_support::postgres_connect(&dsn).await;
                        }
                        let n = (1 + fastrand::usize(..5)).min(rows - written);
                        let rollback = t % 6 == 0;
                        let tx = client.transaction().await.expect("begin");
                        let mut rows_of_tx = Vec::new();
                        for r in 0..n {
                            let channel = format!("orders:{}", fastrand::usize(..channels));
                            let tag = format!("{w}-{t}-{r}");
                            let data = format!("{{\"tag\":\"{tag}\"}}");
                            let id: i64 = tx
                                .query_one(
                                    "INSERT INTO herald_outbox (channel, data) VALUES ($1, $2::text::jsonb) RETURNING id",
                                    &[&channel, &data],
                                )
                                .await
                                .expect("insert")
                                .get(0);
                            rows_of_tx.push(Committed { id, channel, tag });
                            if fastrand::u8(..4) == 0 {
                                tokio::time::sleep(Duration::from_millis(fastrand::u64(..3))).await;
                            }
                        }
                        let mut poisoned = Vec::new();
                        if poison && w == 0 && t == 5 {
                            for (channel, meta) in [("nope:1", None), ("orders:0", Some("{\"k\": 1}"))] {
                                let tag = format!("poison-{channel}");
                                let data = format!("{{\"tag\":\"{tag}\"}}");
                                tx.execute(
                                    "INSERT INTO herald_outbox (channel, data, meta) VALUES ($1, $2::text::jsonb, $3::text::jsonb)",
                                    &[&channel, &data, &meta],
                                )
                                .await
                                .expect("insert poison");
                                poisoned.push(tag);
                            }
                        }
                        if rollback {
                            tx.rollback().await.expect("rollback");
                            let mut l = ledger.lock().unwrap();
                            l.rolled_back.extend(rows_of_tx.into_iter().map(|c| c.tag));
                            l.rolled_back.extend(poisoned);
                        } else {
                            tx.commit().await.expect("commit");
                            let mut l = ledger.lock().unwrap();
                            l.committed.extend(rows_of_tx);
                            l.poisoned.extend(poisoned);
                        }
                        written += n;
                        drop(_held);
                        if !pause.is_zero() {
                            tokio::time::sleep(pause).await;
                        }
                    }
                })
            })
            .collect()
    }
}

/// Deliveries of one subscriber: per channel, `(seq, tag)` in arrival order.
pub type Received = Arc<Mutex<HashMap<String, Vec<(u64, String)>>>>;

/// A client subscribed to every channel, reconnecting to `url` (a fixed
/// port, so a restarted node is found again) and resuming after each loss.
pub async fn subscriber(url: &str, user: &str, channels: usize) -> (Client, Received) {
    let mut opts = ClientOptions::new(ConnectOptions::dev_user(url, user));
    opts.backoff = Backoff { base: Duration::from_millis(50), max: Duration::from_millis(500) };
    opts.max_reconnect_attempts = None;
    let client = Client::new(opts);
    let received: Received = Arc::default();
    for c in 0..channels {
        let channel = format!("orders:{c}");
        // A node on Redis may answer `unavailable` while Redis is slow
        // under the suite's load: subscribing again is what a client does.
        let mut sub = eventually("a subscription", || async {
            match client.subscribe(&channel, None).await {
                Ok(sub) => Some(sub),
                Err(e) if format!("{e:?}").contains("unavailable") => None,
                Err(e) => panic!("subscribe: {e:?}"),
            }
        })
        .await;
        let received = received.clone();
        tokio::spawn(async move {
            while let Some(event) = sub.next().await {
                match event {
                    Ok(Event::Message(m)) => {
                        let v: serde_json::Value = serde_json::from_str(m.data.get()).unwrap();
                        let tag = v["tag"].as_str().unwrap_or_default().to_owned();
                        received
                            .lock()
                            .unwrap()
                            .entry(channel.clone())
                            .or_default()
                            .push((m.seq.unwrap(), tag));
                    }
                    Ok(other) => panic!("{channel}: unexpected {other:?}"),
                    Err(_) => {}
                }
            }
        });
    }
    (client, received)
}

/// Wait until the writers have committed `n` rows (at most [`WAIT`]).
pub async fn committed_at_least(ledger: &Arc<Mutex<Ledger>>, n: usize) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while ledger.lock().unwrap().committed.len() < n {
        assert!(tokio::time::Instant::now() < deadline, "the writers are stuck");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Wait until `received` holds every committed row; `Err` names what is
/// missing after [`WAIT`].
pub async fn all_received(ledger: &Arc<Mutex<Ledger>>, received: &Received, who: &str) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let want = ledger.lock().unwrap().committed.len();
        let got: usize = received.lock().unwrap().values().map(Vec::len).sum();
        if got >= want {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            let seen: HashSet<String> =
                received.lock().unwrap().values().flatten().map(|(_, t)| t.clone()).collect();
            let missing: Vec<(i64, String, String)> = ledger
                .lock()
                .unwrap()
                .committed
                .iter()
                .filter(|c| !seen.contains(&c.tag))
                .map(|c| (c.id, c.channel.clone(), c.tag.clone()))
                .take(20)
                .collect();
            return Err(format!(
                "{who}: {got} of {want} rows delivered; missing (id, channel, tag): {missing:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Panic with `e`, the outbox's rows and the consumer status.
pub async fn explain(e: String, pg: &tokio_postgres::Client, url: &str) -> ! {
    let rows: Vec<(i64, String)> = pg
        .query("SELECT id, channel FROM herald_outbox ORDER BY id LIMIT 20", &[])
        .await
        .map(|rs| rs.iter().map(|r| (r.get(0), r.get(1))).collect())
        .unwrap_or_default();
    let status = api_get(url, "/api/v1/consumers").await;
    panic!("{e}\noutbox rows: {rows:?}\nstatus: {status}");
}

/// Every committed row delivered once, per channel in row-id order with
/// gap-free seqs; nothing rolled back or poisoned delivered.
pub fn check(ledger: &Ledger, received: &HashMap<String, Vec<(u64, String)>>, who: &str) {
    let mut expected: BTreeMap<&str, Vec<(i64, &str)>> = BTreeMap::new();
    for c in &ledger.committed {
        expected.entry(c.channel.as_str()).or_default().push((c.id, c.tag.as_str()));
    }
    for (channel, rows) in expected.iter_mut() {
        rows.sort();
        let got = received.get(*channel).cloned().unwrap_or_default();
        let seqs: Vec<u64> = got.iter().map(|(s, _)| *s).collect();
        assert_eq!(
            seqs,
            (1..=got.len() as u64).collect::<Vec<_>>(),
            "{who} {channel}: seqs gap-free, in order"
        );
        let tags: Vec<&str> = got.iter().map(|(_, t)| t.as_str()).collect();
        let want: Vec<&str> = rows.iter().map(|(_, t)| *t).collect();
        if tags != want {
            let seen: HashSet<&str> = tags.iter().copied().collect();
            let dup = tags.len() - seen.len();
            let lost: Vec<&&str> = want.iter().filter(|t| !seen.contains(**t)).collect();
            let extra: Vec<&&str> = tags.iter().filter(|t| !want.contains(t)).collect();
            panic!(
                "{who} {channel}: delivered != committed in row-id order ({} vs {}; {dup} duplicates, lost {lost:?}, extra {extra:?})",
                tags.len(),
                want.len()
            );
        }
    }
    for (channel, got) in received {
        for (_, tag) in got {
            assert!(!ledger.rolled_back.contains(tag), "{who} {channel}: rolled-back row {tag} delivered");
            assert!(!ledger.poisoned.contains(tag), "{who} {channel}: poisoned row {tag} delivered");
        }
    }
}

/// Rows still in the outbox.
pub async fn outbox_rows(pg: &tokio_postgres::Client) -> i64 {
    pg.query_one("SELECT count(*) FROM herald_outbox", &[]).await.unwrap().get(0)
}

/// `GET path` with the API key: the JSON body.
pub async fn api_get(url: &str, path: &str) -> serde_json::Value {
    reqwest::Client::new()
        .get(format!("{url}{path}"))
        .bearer_auth(API_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}
