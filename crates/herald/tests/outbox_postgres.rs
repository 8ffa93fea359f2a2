//! The PostgreSQL outbox consumer against a real PostgreSQL and real
//! `herald serve` processes: a backend commits rows across many channels in
//! transactions (some rolled back) while subscribers listen; Herald is
//! killed with SIGKILL and restarted, PostgreSQL is restarted, poisoned
//! rows are parked while their partitions go on. Every committed row
//! reaches every subscriber once, per channel in row-id order; nothing
//! rolled back arrives; no row is left behind.

mod outbox_backend;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_test_support::{assert_eventually, eventually, PostgresServer};
use outbox_backend::*;

fn consumer(dsn: &str, partitions: u32) -> String {
    format!(
        r#"
[[consumers]]
name = "orders"
kind = "postgres"
dsn = "{dsn}"
table = "herald_outbox"
partitions = {partitions}
batch_size = 50
poll_interval = "300ms"
"#
    )
}

/// A PostgreSQL holding the outbox table, a client on it, a temp dir, and
/// the configuration of an embedded node there consuming the table with
/// `partitions` (`extra` appended to the consumer's entry).
async fn embedded(
    partitions: u32,
    extra: &str,
) -> (PostgresServer, tokio_postgres::Client, tempfile::TempDir, String) {
    let pg = PostgresServer::start();
    let admin = pg.connect().await;
    admin.batch_execute(DDL).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "engine = \"embedded\"\ndata_dir = {:?}\n{}{extra}",
        dir.path().join("data"),
        consumer(&pg.dsn(), partitions)
    );
    (pg, admin, dir, config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_rows_arrive_once_in_row_id_order_through_kill_9_and_a_postgres_restart() {
    const CHANNELS: usize = 50;
    let (mut pg, _admin, dir, config) = embedded(4, "").await;
    let port = free_port();
    let mut herald = spawn_herald(port, &config, dir.path());
    let url = herald.url.clone();
    let (_a, got_a) = subscriber(&url, "a", CHANNELS).await;
    let (_b, got_b) = subscriber(&url, "b", CHANNELS).await;

    let backend = Backend::new();
    // 10,000 rows (one transaction in six rolled back) from 4 writers.
    let writers = backend.spawn_writers(&pg.dsn(), 4, 2_500, CHANNELS, Duration::from_millis(1), true);

    // SIGKILL Herald mid-run, start it again on the same port and data.
    committed_at_least(&backend.ledger, 2_500).await;
    herald.kill9();
    tokio::time::sleep(Duration::from_millis(300)).await;
    herald = spawn_herald(port, &config, dir.path());

    // Restart PostgreSQL (immediate: every connection killed) with no
    // writer transaction open, so every commit's outcome is known.
    committed_at_least(&backend.ledger, 5_000).await;
    {
        let _no_writers = backend.gate.write().await;
        pg.restart();
    }
    for w in writers {
        w.await.unwrap();
    }
    let ledger = backend.ledger.clone();
    let committed = backend.committed();
    assert!(committed > 7_500 && !ledger.lock().unwrap().rolled_back.is_empty(), "{committed} committed");

    let admin = pg.connect().await;
    for (who, got) in [("a", &got_a), ("b", &got_b)] {
        if let Err(e) = all_received(&ledger, got, who).await {
            explain(e, &admin, &herald.url).await;
        }
    }
    // Nothing more arrives (no late duplicate).
    tokio::time::sleep(Duration::from_millis(500)).await;
    {
        let l = ledger.lock().unwrap();
        check(&l, &got_a.lock().unwrap(), "a");
        check(&l, &got_b.lock().unwrap(), "b");
    }
    assert_eq!(outbox_rows(&admin).await, 0, "no row left behind");

    // The two poisoned rows are parked, visible through the API.
    let parked = api_get(&herald.url, "/api/v1/consumers/orders/parked").await;
    let rows = parked["rows"].as_array().unwrap();
    let mut codes: Vec<&str> = rows.iter().map(|r| r["code"].as_str().unwrap()).collect();
    codes.sort();
    assert_eq!(codes, ["bad_request", "unknown_namespace"], "{parked}");
    let url = herald.url.clone();
    assert_eventually("the status shows every partition owned and both parked rows", || {
        let url = url.clone();
        async move {
            let s = api_get(&url, "/api/v1/consumers").await;
            let parts = s["consumers"][0]["partitions"].as_array().unwrap().clone();
            parts.len() == 4
                && parts.iter().all(|p| p["owned"] == true && p["lag"] == 0)
                && parts.iter().map(|p| p["parked_rows"].as_u64().unwrap_or(0)).sum::<u64>() == 2
        }
    })
    .await;
    let metrics = reqwest::get(format!("{}/metrics", herald.url)).await.unwrap().text().await.unwrap();
    // Counted since this process started (the rows were parked before the kill).
    for name in ["published_total", "duplicates_total", "parked_total", "errors_total"] {
        assert!(metrics.contains(&format!("herald_consumer_{name}{{consumer=\"orders\"}}")), "{name}");
    }
    assert!(metrics.contains("herald_consumer_lag_rows{consumer=\"orders\",partition=\"3\"} 0"));
    println!("{committed} rows committed, {} rolled back", ledger.lock().unwrap().rolled_back.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_row_fixed_in_the_dead_letter_table_is_published_on_retry() {
    let (_pg, admin, dir, config) = embedded(1, "").await;
    let herald = spawn_herald(0, &config, dir.path());
    let (_c, got) = subscriber(&herald.url, "c", 1).await;
    admin
        .batch_execute(
            r#"INSERT INTO herald_outbox (channel, data) VALUES ('orders:0', '{"tag":"first"}');
               INSERT INTO herald_outbox (channel, data, meta) VALUES ('orders:0', '{"tag":"bad"}', '[1]');
               INSERT INTO herald_outbox (channel, data) VALUES ('orders:0', '{"tag":"third"}');"#,
        )
        .await
        .unwrap();
    let tags = || got.lock().unwrap().get("orders:0").cloned().unwrap_or_default();
    assert_eventually("the partition goes on past the parked row", || async { tags().len() == 2 }).await;
    assert_eq!(tags(), [(1, "first".to_owned()), (2, "third".to_owned())]);
    // The batch's removal transaction (which parks the row) commits after
    // its appends were fanned out.
    let url = herald.url.clone();
    assert_eventually("the row is parked", || async {
        !api_get(&url, "/api/v1/consumers/orders/parked").await["rows"].as_array().unwrap().is_empty()
    })
    .await;
    let parked = api_get(&herald.url, "/api/v1/consumers/orders/parked").await;
    let row = &parked["rows"][0];
    assert_eq!((row["channel"].as_str(), row["code"].as_str()), (Some("orders:0"), Some("bad_request")));
    assert!(row["error"].as_str().unwrap().contains("meta"), "{row}");

    // The operator fixes the row and retries it: it is published after
    // the rows already there.
    admin.execute("UPDATE herald_outbox_dead SET meta = '{\"k\":\"v\"}'", &[]).await.unwrap();
    let id = row["id"].as_i64().unwrap();
    let r = reqwest::Client::new()
        .post(format!("{}/api/v1/consumers/orders/parked/{id}/retry", herald.url))
        .bearer_auth(API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body: serde_json::Value = r.json().await.unwrap();
    assert!(body["new_id"].as_i64().unwrap() > id, "{body}");
    assert_eventually("the retried row is published", || async { tags().len() == 3 }).await;
    assert_eq!(tags()[2], (3, "bad".to_owned()));
    assert_eq!(api_get(&herald.url, "/api/v1/consumers/orders/parked").await["rows"], serde_json::json!([]));
    let r = reqwest::Client::new()
        .post(format!("{}/api/v1/consumers/orders/parked/{id}/retry", herald.url))
        .bearer_auth(API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404, "retried once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marked_rows_stay_with_their_publish_time_and_are_published_once() {
    let (_pg, admin, dir, config) = embedded(2, "after_publish = \"mark\"\n").await;
    admin
        .batch_execute("ALTER TABLE herald_outbox ADD COLUMN herald_published_at timestamptz")
        .await
        .unwrap();
    let port = free_port();
    let mut herald = spawn_herald(port, &config, dir.path());
    let (_c, got) = subscriber(&herald.url, "m", 3).await;
    for i in 0..30 {
        let data = format!("{{\"tag\":\"m{i}\"}}");
        admin
            .execute(
                "INSERT INTO herald_outbox (channel, data) VALUES ($1, $2::text::jsonb)",
                &[&format!("orders:{}", i % 3), &data],
            )
            .await
            .unwrap();
    }
    let count = || got.lock().unwrap().values().map(Vec::len).sum::<usize>();
    assert_eventually("every row published", || async { count() == 30 }).await;
    // A row is marked after its append is durable, which may be after a
    // subscriber got its message.
    let marked = || async {
        let n: i64 = admin
            .query_one("SELECT count(*) FROM herald_outbox WHERE herald_published_at IS NOT NULL", &[])
            .await
            .unwrap()
            .get(0);
        n
    };
    assert_eventually("rows kept, each marked", || async { marked().await == 30 }).await;
    let total: i64 = admin.query_one("SELECT count(*) FROM herald_outbox", &[]).await.unwrap().get(0);
    assert_eq!(total, 30, "marked rows are kept");
    // A restarted node reads no marked row again.
    herald.kill9();
    herald = spawn_herald(port, &config, dir.path());
    admin
        .execute("INSERT INTO herald_outbox (channel, data) VALUES ('orders:0', '{\"tag\":\"after\"}')", &[])
        .await
        .unwrap();
    assert_eventually("the new row published", || async { count() == 31 }).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(count(), 31, "nothing published twice");
    for (channel, rows) in got.lock().unwrap().iter() {
        let seqs: Vec<u64> = rows.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, (1..=rows.len() as u64).collect::<Vec<_>>(), "{channel}");
    }
    drop(herald);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_committed_after_a_later_id_is_still_published_first() {
    let (pg, admin, dir, config) = embedded(1, "").await;
    let herald = spawn_herald(0, &config, dir.path());
    let (_c, got) = subscriber(&herald.url, "o", 1).await;
    let tags = || got.lock().unwrap().get("orders:0").cloned().unwrap_or_default();

    // The slow transaction takes id 1 and stays open; id 2 commits.
    let mut slow = pg.connect().await;
    let tx = slow.transaction().await.unwrap();
    let first: i64 = tx
        .query_one("INSERT INTO herald_outbox (channel, data) VALUES ('orders:0', '{\"tag\":\"slow\"}') RETURNING id", &[])
        .await
        .unwrap()
        .get(0);
    let second: i64 = admin
        .query_one("INSERT INTO herald_outbox (channel, data) VALUES ('orders:0', '{\"tag\":\"fast\"}') RETURNING id", &[])
        .await
        .unwrap()
        .get(0);
    assert!(first < second);
    let url = herald.url.clone();
    assert_eventually("the status says the partition waits for a transaction", || async {
        let s = api_get(&url, "/api/v1/consumers").await;
        s["consumers"][0]["partitions"][0]["last_error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("long transaction"))
    })
    .await;
    assert!(tags().is_empty(), "nothing published past an open transaction's id: {:?}", tags());
    tx.commit().await.unwrap();
    assert_eventually("both published", || async { tags().len() == 2 }).await;
    assert_eq!(tags(), [(1, "slow".to_owned()), (2, "fast".to_owned())], "row-id order, not commit order");
    assert_eventually("the wait is no longer reported", || async {
        api_get(&url, "/api/v1/consumers").await["consumers"][0]["partitions"][0]["last_error"].is_null()
    })
    .await;
}

/// The optional columns: several channels per row, scheduled rows, and the
/// index the due-time lookup uses.
const SEVERAL_AND_SCHEDULED: &str = "
ALTER TABLE herald_outbox ALTER COLUMN channel DROP NOT NULL,
    ADD COLUMN channels text[], ADD COLUMN deliver_at timestamptz;
CREATE INDEX herald_outbox_deliver_at ON herald_outbox (deliver_at) WHERE deliver_at IS NOT NULL;
";

/// Insert one row with `channel` and `channels` tagged `tag`; the ledger
/// gets one entry per channel it names (`channel` first, each once), or a
/// poisoned tag when it names none.
async fn insert_several(
    pg: &tokio_postgres::Client,
    ledger: &std::sync::Mutex<Ledger>,
    channel: Option<&str>,
    channels: Option<&[&str]>,
    tag: &str,
) -> i64 {
    let data = format!("{{\"tag\":\"{tag}\"}}");
    let list: Option<Vec<String>> = channels.map(|c| c.iter().map(|c| c.to_string()).collect());
    let id: i64 = pg
        .query_one(
            "INSERT INTO herald_outbox (channel, channels, data) VALUES ($1, $2, $3::text::jsonb) RETURNING id",
            &[&channel, &list, &data],
        )
        .await
        .unwrap()
        .get(0);
    let mut named: Vec<String> = Vec::new();
    for c in channel.into_iter().chain(channels.unwrap_or_default().iter().copied()) {
        if !named.iter().any(|n| n == c) {
            named.push(c.to_owned());
        }
    }
    let mut l = ledger.lock().unwrap();
    if named.is_empty() {
        l.poisoned.insert(tag.to_owned());
    }
    for channel in named {
        l.committed.push(Committed { id, channel, tag: tag.to_owned() });
    }
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_several_channels_arrive_once_on_each_in_row_id_order_through_kill_9() {
    const CHANNELS: usize = 4;
    let (pg, admin, dir, config) = embedded(1, "").await;
    admin.batch_execute(SEVERAL_AND_SCHEDULED).await.unwrap();
    let port = free_port();
    let mut herald = spawn_herald(port, &config, dir.path());
    let (_a, got_a) = subscriber(&herald.url, "a", CHANNELS).await;
    let (_b, got_b) = subscriber(&herald.url, "b", CHANNELS).await;

    // Single-channel rows interleaved with rows of two or three channels
    // (some with no `channel`, only `channels`) and one naming none.
    let ledger: Arc<Mutex<Ledger>> = Arc::default();
    let writer = {
        let (dsn, ledger) = (pg.dsn(), ledger.clone());
        tokio::spawn(async move {
            let pg = herald_test_support::postgres_connect(&dsn).await;
            let ch = |i: usize| format!("orders:{}", i % CHANNELS);
            for i in 0..400usize {
                let tag = format!("r{i}");
                let (x, y, z) = (ch(fastrand::usize(..)), ch(fastrand::usize(..)), ch(fastrand::usize(..)));
                match (i, fastrand::u8(..10)) {
                    (50, _) => insert_several(&pg, &ledger, None, Some(&[]), &tag).await,
                    (_, 0..=5) => insert_several(&pg, &ledger, Some(&x), None, &tag).await,
                    (_, 6..=8) => insert_several(&pg, &ledger, Some(&x), Some(&[&y, &z]), &tag).await,
                    _ => insert_several(&pg, &ledger, None, Some(&[&y, &x]), &tag).await,
                };
                if fastrand::u8(..4) == 0 {
                    tokio::time::sleep(Duration::from_millis(3)).await;
                }
            }
        })
    };
    while ledger.lock().unwrap().committed.len() < 250 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    herald.kill9();
    tokio::time::sleep(Duration::from_millis(300)).await;
    herald = spawn_herald(port, &config, dir.path());
    writer.await.unwrap();
    let several = ledger.lock().unwrap().committed.len();
    assert!(several > 400, "rows of several channels written: {several} deliveries expected");

    for (who, got) in [("a", &got_a), ("b", &got_b)] {
        if let Err(e) = all_received(&ledger, got, who).await {
            explain(e, &admin, &herald.url).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    check(&ledger.lock().unwrap(), &got_a.lock().unwrap(), "a");
    check(&ledger.lock().unwrap(), &got_b.lock().unwrap(), "b");
    assert_eq!(outbox_rows(&admin).await, 0, "no row left behind");

    // The row naming no channel is parked as a bad channel.
    let url = herald.url.clone();
    assert_eventually("the row without channels is parked", || async {
        api_get(&url, "/api/v1/consumers/orders/parked").await["rows"].as_array().unwrap().len() == 1
    })
    .await;
    let parked = api_get(&herald.url, "/api/v1/consumers/orders/parked").await;
    let row = &parked["rows"][0];
    assert_eq!(row["code"], "bad_channel", "{parked}");
    assert!(row["error"].as_str().unwrap().contains("no channel"), "{parked}");

    // A row of two channels, one in an unknown namespace, is parked whole
    // with its `channels`; fixed there and retried, it reaches both.
    insert_several(&admin, &Mutex::default(), Some("orders:1"), Some(&["nope:1"]), "fixed").await;
    let parked = eventually("the row is parked", || async {
        let rows = api_get(&url, "/api/v1/consumers/orders/parked").await["rows"].clone();
        rows.as_array().unwrap().iter().find(|r| r["code"] == "unknown_namespace").cloned()
    })
    .await;
    assert_eq!(parked["channels"], serde_json::json!(["nope:1"]), "{parked}");
    admin
        .execute(
            "UPDATE herald_outbox_dead SET channels = '{orders:2}' WHERE id = $1",
            &[&parked["id"].as_i64()],
        )
        .await
        .unwrap();
    let r = reqwest::Client::new()
        .post(format!("{}/api/v1/consumers/orders/parked/{}/retry", herald.url, parked["id"]))
        .bearer_auth(API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let new_id = r.json::<serde_json::Value>().await.unwrap()["new_id"].as_i64().unwrap();
    {
        let mut l = ledger.lock().unwrap();
        for channel in ["orders:1", "orders:2"] {
            l.committed.push(Committed { id: new_id, channel: channel.to_owned(), tag: "fixed".to_owned() });
        }
    }
    all_received(&ledger, &got_a, "a").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    check(&ledger.lock().unwrap(), &got_a.lock().unwrap(), "a");
    assert_eventually("the outbox ends empty", || async { outbox_rows(&admin).await == 0 }).await;
}

/// Milliseconds since the Unix epoch by this machine's clock (PostgreSQL's
/// too: it runs here).
fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_row_arrives_at_its_time_after_later_rows_and_survives_kill_9() {
    // A poll interval far longer than the test: only the partition's wake
    // at the row's due time can publish it on time.
    let (_pg, admin, dir, config) = embedded(2, "").await;
    let config = config.replace("poll_interval = \"300ms\"", "poll_interval = \"60s\"");
    admin.batch_execute(SEVERAL_AND_SCHEDULED).await.unwrap();
    let port = free_port();
    let mut herald = spawn_herald(port, &config, dir.path());
    let (_c, got) = subscriber(&herald.url, "s", 1).await;
    let tags = || got.lock().unwrap().get("orders:0").cloned().unwrap_or_default();

    let due_ms: i64 = admin
        .query_one(
            "INSERT INTO herald_outbox (channel, data, deliver_at) \
             VALUES ('orders:0', '{\"tag\":\"scheduled\"}', now() + interval '3 seconds') \
             RETURNING (extract(epoch FROM deliver_at) * 1000)::bigint",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    admin
        .execute("INSERT INTO herald_outbox (channel, data) VALUES ('orders:0', '{\"tag\":\"now\"}')", &[])
        .await
        .unwrap();
    assert_eventually("the later, unscheduled row is published first", || async { tags().len() == 1 }).await;
    assert_eq!(tags(), [(1, "now".to_owned())]);
    assert!(now_ms() < due_ms - 1000, "the test is too slow to see the row wait");

    // Herald dies while the row waits; the row waits in the outbox.
    herald.kill9();
    herald = spawn_herald(port, &config, dir.path());
    let url = herald.url.clone();
    assert_eventually("the status counts the scheduled row, not as lag", || async {
        let s = api_get(&url, "/api/v1/consumers").await;
        let parts = s["consumers"][0]["partitions"].as_array().unwrap().clone();
        parts.iter().all(|p| p["owned"] == true && p["lag"] == 0)
            && parts.iter().map(|p| p["scheduled_rows"].as_u64().unwrap_or(0)).sum::<u64>() == 1
    })
    .await;
    let arrived = loop {
        if tags().len() == 2 {
            break now_ms();
        }
        assert!(now_ms() < due_ms + 10_000, "the scheduled row never arrived");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(arrived >= due_ms, "published {} ms before its deliver_at", due_ms - arrived);
    assert!(arrived <= due_ms + 1000, "published {} ms after its deliver_at", arrived - due_ms);
    assert_eq!(tags(), [(1, "now".to_owned()), (2, "scheduled".to_owned())]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(tags().len(), 2, "published once");
    assert_eventually("the outbox ends empty", || async { outbox_rows(&admin).await == 0 }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_optional_column_of_another_type_is_named_in_the_status() {
    let (_pg, admin, dir, config) = embedded(1, "").await;
    admin.batch_execute("ALTER TABLE herald_outbox ADD COLUMN deliver_at bigint").await.unwrap();
    admin
        .execute("INSERT INTO herald_outbox (channel, data) VALUES ('orders:0', '{\"tag\":\"x\"}')", &[])
        .await
        .unwrap();
    let herald = spawn_herald(0, &config, dir.path());
    let url = herald.url.clone();
    assert_eventually("the status names the column and the type it needs", || async {
        let s = api_get(&url, "/api/v1/consumers").await;
        s["consumers"][0]["partitions"][0]["last_error"]["message"].as_str().is_some_and(|m| {
            m.contains("column deliver_at of herald_outbox is bigint; it must be timestamptz")
        })
    })
    .await;
    assert_eq!(outbox_rows(&admin).await, 1, "nothing read from a table it cannot read right");
}
