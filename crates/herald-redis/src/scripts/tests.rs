//! Every `.lua` file's header names its `KEYS` and `ARGV` in the order its
//! argument struct pushes them.

use super::args::*;

/// The `KEYS:` and `ARGV:` sections of a script's leading comment, without
/// whitespace (a section may wrap onto `--` continuation lines).
fn header(source: &str) -> (String, String) {
    let text: String = source
        .lines()
        .take_while(|l| l.starts_with("--"))
        .map(|l| l.trim_start_matches('-'))
        .collect::<Vec<_>>()
        .join(" ")
        .split_whitespace()
        .collect();
    let keys_at = text.find("KEYS:").expect("a KEYS: line");
    let argv_at = text.find("ARGV:").expect("an ARGV: line");
    (text[keys_at + 5..argv_at].to_owned(), text[argv_at + 5..].to_owned())
}

fn expected(names: Vec<String>) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(",")
    }
}

fn checked<S: ScriptHeader>(name: &str) {
    let (k, a) = header(S::SOURCE);
    assert_eq!(k, expected(S::keys()), "{name}: KEYS in the header and the struct differ");
    assert_eq!(a, expected(S::argv()), "{name}: ARGV in the header and the struct differ");
}

#[test]
fn lua_headers_match_the_argument_structs() {
    checked::<Append<'static>>("Append");
    checked::<VolatileRun>("VolatileRun");
    checked::<Read>("Read");
    checked::<Check>("Check");
    checked::<BumpEpoch>("BumpEpoch");
    checked::<Ack>("Ack");
    checked::<NodeLeaseKeep>("NodeLeaseKeep");
    checked::<NodeLeaseRelease>("NodeLeaseRelease");
    checked::<OwnClaim>("OwnClaim");
    checked::<OwnRelease>("OwnRelease");
    checked::<PresenceJoin>("PresenceJoin");
    checked::<PresenceRenew>("PresenceRenew");
    checked::<PresenceLeave>("PresenceLeave");
    checked::<PresenceRejoin>("PresenceRejoin");
    checked::<PresenceList>("PresenceList");
    checked::<PresenceCount>("PresenceCount");
    checked::<PresenceHasUser>("PresenceHasUser");
    checked::<PresenceSweep>("PresenceSweep");
    checked::<IndexLower>("IndexLower");
    checked::<IndexClaim>("IndexClaim");
    checked::<IndexSettle>("IndexSettle");
    checked::<RoomWrite>("RoomWrite");
    checked::<SchedAdd>("SchedAdd");
    checked::<SchedClaim>("SchedClaim");
    checked::<SchedDeliver>("SchedDeliver");
    checked::<SchedCancel>("SchedCancel");
}

#[test]
fn every_lua_file_has_an_argument_struct() {
    // The scripts above plus the two shared preludes.
    let files = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/src/scripts"))
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().into_string().ok())
        .filter(|n| n.ends_with(".lua"))
        .count();
    assert_eq!(files, 26 + 2);
}

#[test]
fn gone_placeholders_are_filled() {
    let text = super::gone_text();
    assert!(!text.contains("${"), "a placeholder left in gone.lua: {text}");
}

/// A durable message of an `APPEND` run without a receipt: its 6
/// arguments (kind, max_len, max_age_ms, head, id, tail).
fn message(max_len: &str) -> Vec<String> {
    ["d", max_len, "0", "{\"seq\":", "m-1", "}"].map(str::to_owned).to_vec()
}

/// A volatile message of an `APPEND` run (its kind, id, frame parts, and
/// the receipt's fingerprint and TTL if any), as given.
fn volatile(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// Runs `APPEND` on channel `a` (a durable message) then `b` (`second`).
async fn append_two(
    con: &mut redis::aio::MultiplexedConnection,
    second: Vec<String>,
) -> redis::RedisResult<String> {
    let mut argv = vec!["PUBLISH".to_owned(), "e1".to_owned()];
    argv.extend(["c", "chat:a", "a:fan"].map(str::to_owned));
    argv.extend(message("0"));
    argv.extend(["c", "chat:b", "b:fan"].map(str::to_owned));
    argv.extend(second);
    append_raw(con, &["a:meta", "a:log", "b:meta", "b:log"], &argv).await
}

/// Runs `APPEND` with these keys and arguments as they are.
async fn append_raw(
    con: &mut redis::aio::MultiplexedConnection,
    keys: &[&str],
    argv: &[String],
) -> redis::RedisResult<String> {
    let mut inv = super::APPEND.prepare_invoke();
    for k in keys {
        inv.key(*k);
    }
    for a in argv {
        inv.arg(a);
    }
    inv.invoke_async(con).await
}

#[tokio::test]
async fn append_checks_every_argument_it_reads_before_its_first_write() {
    let redis = crate::testing::RedisServer::start();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    // A durable message's max_len is passed on to XADD as text: only a
    // canonical count passes, and a bad one fails the run before `a` is
    // written.
    let refused = async |con: &mut redis::aio::MultiplexedConnection, second: Vec<String>, what: &str| {
        let err = append_two(con, second).await.expect_err(what);
        assert!(err.to_string().contains("bad arguments"), "{what}: {err}");
        let exists: u32 = redis::cmd("EXISTS").arg("a:meta").arg("a:log").query_async(con).await.unwrap();
        assert_eq!(exists, 0, "{what}: nothing written");
    };
    for bad in ["00", "1e3", "-1", "", "x"] {
        refused(&mut con, message(bad), bad).await;
    }
    // A volatile message: four arguments, six with a receipt (its
    // fingerprint and TTL); anything else is refused as a whole.
    refused(&mut con, volatile(&["v", "m-2", "{\"ts\":"]), "short").await;
    refused(&mut con, volatile(&["vr", "m-2", "{\"ts\":", "}"]), "receipt without its TTL").await;
    for kind in ["vx", "vc", "0", "1", "D", ""] {
        refused(&mut con, volatile(&[kind, "m-2", "{\"ts\":", "}"]), kind).await;
    }
    refused(&mut con, volatile(&["v", "", "{\"ts\":", "}"]), "no id").await;
    refused(&mut con, volatile(&["v", "m-2", "{\"ts\":", "}", "extra"]), "an argument too many").await;
    let mut no_id = message("0");
    no_id[4] = String::new();
    refused(&mut con, no_id, "a durable message without an id").await;
    let lines = append_two(&mut con, volatile(&["v", "m-2", "{\"ts\":", "}"])).await.unwrap();
    let lines: Vec<&str> = lines.lines().collect();
    assert!(lines[0].starts_with("ok 1 "), "{lines:?}");
    assert!(lines[1].starts_with("ok - "), "{lines:?}");
    // And the limit applies: max_len 1 keeps one entry.
    append_two(&mut con, message("1")).await.unwrap();
    append_two(&mut con, message("1")).await.unwrap();
    let len: u32 = redis::cmd("XLEN").arg("b:log").query_async(&mut con).await.unwrap();
    assert_eq!(len, 1);
}

#[tokio::test]
async fn append_takes_every_key_in_order_exactly_once() {
    let redis = crate::testing::RedisServer::start();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let channel = |name: &str| ["c", name, "fan"].map(str::to_owned).to_vec();
    let keyed = |fp: &str| {
        let mut m = message("0");
        m[0] = "dr".to_owned();
        m.extend([fp.to_owned(), "60000".to_owned()]);
        m
    };
    let args = |items: Vec<Vec<String>>| {
        let mut argv = vec!["PUBLISH".to_owned(), "e1".to_owned()];
        argv.extend(items.into_iter().flatten());
        argv
    };
    let refused = [
        ("a key left over", vec!["m", "l", "extra"], args(vec![channel("x"), message("0")])),
        ("a key missing", vec!["m"], args(vec![channel("x"), message("0")])),
        ("a receipt key missing", vec!["m", "l"], args(vec![channel("x"), keyed("f")])),
        ("a message before any channel", vec!["m", "l"], args(vec![message("0"), channel("x")])),
        (
            "a channel without messages",
            vec!["m", "l", "m2", "l2"],
            args(vec![channel("x"), channel("y"), message("0")]),
        ),
        (
            "a last channel without messages",
            vec!["m", "l", "m2", "l2"],
            args(vec![channel("x"), message("0"), channel("y")]),
        ),
        ("no channel", vec![], args(vec![])),
        ("no epoch", vec!["m", "l"], {
            let mut argv = args(vec![channel("x"), message("0")]);
            argv[1] = String::new();
            argv
        }),
        (
            "a receipt without its fingerprint and TTL",
            vec!["m", "l", "r"],
            args(vec![channel("x"), {
                let mut m = message("0");
                m[0] = "dr".to_owned();
                m
            }]),
        ),
        (
            "a receipt's TTL of 0",
            vec!["m", "l", "r"],
            args(vec![channel("x"), {
                let mut m = keyed("f");
                m[7] = "0".to_owned();
                m
            }]),
        ),
    ];
    for (what, keys, argv) in refused {
        let err = append_raw(&mut con, &keys, &argv).await.expect_err(what);
        assert!(err.to_string().contains("bad arguments"), "{what}: {err}");
    }
    let exists: u32 = redis::cmd("EXISTS").arg("m").arg("l").arg("m2").query_async(&mut con).await.unwrap();
    assert_eq!(exists, 0, "nothing written");
    // Two channels, the second's messages keyed: each receipt is the next
    // key, after its channel's meta and log.
    let keys = ["m", "l", "m2", "l2", "r1", "r2"];
    let argv = args(vec![channel("x"), message("0"), channel("y"), keyed("f1"), keyed("f2")]);
    let lines = append_raw(&mut con, &keys, &argv).await.unwrap();
    let lines: Vec<&str> = lines.lines().collect();
    assert!(
        lines[0].starts_with("ok 1 ") && lines[1].starts_with("ok 1 ") && lines[2].starts_with("ok 2 "),
        "{lines:?}"
    );
    let receipts: Vec<String> = redis::cmd("MGET").arg("r1").arg("r2").query_async(&mut con).await.unwrap();
    assert!(receipts[0].starts_with("f1 1 ") && receipts[1].starts_with("f2 2 "), "{receipts:?}");
}

#[tokio::test]
async fn append_sets_the_logs_expiry_only_when_less_than_max_age_is_left() {
    let redis = crate::testing::RedisServer::start();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let aged = |max_age: &str| {
        let mut m = message("0");
        m[2] = max_age.to_owned();
        m
    };
    let append = async |con: &mut redis::aio::MultiplexedConnection, m: Vec<String>| {
        let mut argv = vec!["PUBLISH".to_owned(), "e1".to_owned()];
        argv.extend(["c", "chat:a", "a:fan"].map(str::to_owned));
        argv.extend(m);
        append_raw(con, &["a:meta", "a:log"], &argv).await.unwrap()
    };
    let expiry = async |con: &mut redis::aio::MultiplexedConnection| -> (i64, Option<i64>) {
        let at: i64 = redis::cmd("PEXPIRETIME").arg("a:log").query_async(con).await.unwrap();
        let exp: Option<i64> = redis::cmd("HGET").arg("a:meta").arg("exp").query_async(con).await.unwrap();
        (at, exp)
    };
    // max_age 800 s: the log expires at max_age plus a minute's slack
    // (an eighth of max_age, at most a minute), and the meta says when.
    let before = now_ms(&mut con).await;
    append(&mut con, aged("800000")).await;
    let (at, exp) = expiry(&mut con).await;
    assert_eq!(Some(at), exp);
    assert!(at >= before + 860_000 && at <= now_ms(&mut con).await + 860_000, "{at} vs {before}");
    // Well within the slack: the expiry stays where it is.
    append(&mut con, aged("800000")).await;
    assert_eq!(expiry(&mut con).await, (at, exp));
    // A longer max_age: less than it is left, so the expiry is set again.
    append(&mut con, aged("900000")).await;
    let (later, exp) = expiry(&mut con).await;
    assert!(later > at && Some(later) == exp, "{later} vs {at}");
    // No max_age: the expiry goes, and the meta forgets it.
    append(&mut con, aged("0")).await;
    assert_eq!(expiry(&mut con).await, (-1, None));
    append(&mut con, aged("0")).await;
    assert_eq!(expiry(&mut con).await, (-1, None));
    // A log whose meta was lost: its expiry is not trusted, but set.
    append(&mut con, aged("800000")).await;
    let _: () = redis::cmd("DEL").arg("a:meta").query_async(&mut con).await.unwrap();
    let _: () = redis::cmd("PEXPIRE").arg("a:log").arg(5_000_000).query_async(&mut con).await.unwrap();
    append(&mut con, aged("0")).await;
    assert_eq!(expiry(&mut con).await, (-1, None));
    // A meta a read recreated over a log with an expiry records it, so the
    // next append without max_age still removes it.
    append(&mut con, aged("800000")).await;
    let _: () = redis::cmd("DEL").arg("a:meta").query_async(&mut con).await.unwrap();
    let mut read = super::READ.prepare_invoke();
    read.key("a:meta").key("a:log").arg("e2").arg(0).arg(0);
    let _: redis::Value = read.invoke_async(&mut con).await.unwrap();
    let (at, exp) = expiry(&mut con).await;
    assert!(at > 0 && exp.is_some_and(|e| (e - at).abs() <= 5), "{at} vs {exp:?}");
    append(&mut con, aged("0")).await;
    assert_eq!(expiry(&mut con).await, (-1, None));
}

/// Redis's clock, in ms.
async fn now_ms(con: &mut redis::aio::MultiplexedConnection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query_async(con).await.unwrap();
    s * 1000 + us / 1000
}

/// Runs `VOLATILE` with these keys and arguments as they are.
async fn volatile_raw(
    con: &mut redis::aio::MultiplexedConnection,
    keys: &[&str],
    argv: &[&str],
) -> redis::RedisResult<String> {
    let mut inv = super::VOLATILE.prepare_invoke();
    for k in keys {
        inv.key(*k);
    }
    for a in argv {
        inv.arg(*a);
    }
    inv.invoke_async(con).await
}

/// The next pub/sub message's payload, as text.
async fn next_payload(rx: &mut tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>) -> String {
    loop {
        let push = tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv())
            .await
            .expect("a push within 5 s")
            .expect("the connection is open");
        if push.kind == redis::PushKind::Message {
            let payload = push.data.last().expect("a payload");
            return redis::from_redis_value::<String>(payload.clone()).unwrap();
        }
    }
}

/// A payload with its ts (the same Redis clock reading in both places)
/// replaced by `T`, so that two runs' payloads compare.
fn without_ts(payload: &str) -> String {
    let ts = payload.split(' ').nth(3).expect("a ts field").to_owned();
    payload.replace(&ts, "T")
}

#[tokio::test]
async fn volatile_publishes_and_answers_what_append_would() {
    let redis = crate::testing::RedisServer::start();
    let client = redis::Client::open(redis.url() + "?protocol=resp3").unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let config = redis::AsyncConnectionConfig::new().set_push_sender(tx);
    let mut sub = client.get_multiplexed_async_connection_with_config(&config).await.unwrap();
    sub.subscribe(&["a:fan", "b:fan"]).await.unwrap();
    let (head, tail) = ("{\"type\":\"message\",\"ts\":", ",\"data\":1}");

    // Every argument is checked before the first publish.
    let refused: [(&str, Vec<&str>, Vec<&str>); 5] = [
        ("no message", vec![], vec!["PUBLISH"]),
        ("another command", vec!["a:meta"], vec!["SET", "chat:a", "a:fan", "m-1", head, tail]),
        ("an argument missing", vec!["a:meta"], vec!["PUBLISH", "chat:a", "a:fan", "m-1", head]),
        (
            "a key missing",
            vec!["a:meta"],
            vec!["PUBLISH", "chat:a", "a:fan", "m-1", head, tail, "chat:b", "b:fan", "m-2", head, tail],
        ),
        (
            "no id",
            vec!["a:meta", "b:meta"],
            vec!["PUBLISH", "chat:a", "a:fan", "m-1", head, tail, "chat:b", "b:fan", "", head, tail],
        ),
    ];
    for (what, keys, argv) in refused {
        let err = volatile_raw(&mut con, &keys, &argv).await.expect_err(what);
        assert!(err.to_string().contains("bad arguments"), "{what}: {err}");
    }

    // Channel `a` has a meta (a durable message made it), `b` none: each
    // message's line and payload are APPEND's for the same message.
    let mut argv = vec!["PUBLISH".to_owned(), "e1".to_owned()];
    argv.extend(["c", "chat:a", "a:fan"].map(str::to_owned));
    argv.extend(message("0"));
    append_raw(&mut con, &["a:meta", "a:log"], &argv).await.unwrap();
    let durable = next_payload(&mut rx).await;
    assert!(durable.starts_with("v2 chat:a 1 "), "{durable}");
    let epoch: String = redis::cmd("HGET").arg("a:meta").arg("epoch").query_async(&mut con).await.unwrap();
    let mut by_append = Vec::new();
    for (ch, fan, meta, log) in
        [("chat:a", "a:fan", "a:meta", "a:log"), ("chat:b", "b:fan", "b:meta", "b:log")]
    {
        let mut argv = vec!["PUBLISH".to_owned(), "e2".to_owned()];
        argv.extend(["c", ch, fan].map(str::to_owned));
        argv.extend(volatile(&["v", "m-2", head, tail]));
        let line = append_raw(&mut con, &[meta, log], &argv).await.unwrap();
        by_append.push((line, next_payload(&mut rx).await));
    }
    let argv = ["PUBLISH", "chat:a", "a:fan", "m-2", head, tail, "chat:a", "a:fan", "m-2", head, tail];
    let argv: Vec<&str> = argv.into_iter().chain(["chat:b", "b:fan", "m-2", head, tail]).collect();
    let lines = volatile_raw(&mut con, &["a:meta", "a:meta", "b:meta"], &argv).await.unwrap();
    let lines: Vec<&str> = lines.lines().collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    let mut payloads = Vec::new();
    for _ in 0..3 {
        payloads.push(next_payload(&mut rx).await);
    }
    let ts_of = |line: &str| line.split(' ').nth(2).unwrap().to_owned();
    let same = |line: &str, appended: &str| {
        line.replace(&ts_of(line), "T") == appended.replace(&ts_of(appended), "T")
    };
    assert!(same(lines[0], &by_append[0].0) && same(lines[1], &by_append[0].0), "{lines:?} vs {by_append:?}");
    assert!(same(lines[2], &by_append[1].0), "{lines:?} vs {by_append:?}");
    assert_eq!(lines[0], format!("ok - {} {epoch} 0", ts_of(lines[0])));
    assert_eq!(lines[2], format!("ok - {} - 0", ts_of(lines[2])));
    assert_eq!(without_ts(&payloads[0]), without_ts(&by_append[0].1));
    assert_eq!(payloads[0], payloads[1]);
    assert_eq!(without_ts(&payloads[2]), without_ts(&by_append[1].1));
    assert!(
        payloads[0].starts_with(&format!("v2 chat:a - {} m-2 {epoch} 0\n{head}", ts_of(lines[0]))),
        "{}",
        payloads[0]
    );

    // A closed channel refuses its messages and publishes nothing; the
    // others of the run are published.
    let _: () = redis::cmd("HSET").arg("a:meta").arg("closed").arg("1").query_async(&mut con).await.unwrap();
    let argv = ["PUBLISH", "chat:a", "a:fan", "m-3", head, tail, "chat:b", "b:fan", "m-4", head, tail];
    let lines = volatile_raw(&mut con, &["a:meta", "b:meta"], &argv).await.unwrap();
    let lines: Vec<&str> = lines.lines().collect();
    assert_eq!(lines[0], "closed");
    assert!(lines[1].starts_with("ok - "), "{lines:?}");
    let next = next_payload(&mut rx).await;
    assert!(next.starts_with("v2 chat:b - ") && next.contains(" m-4 "), "{next}");
}
