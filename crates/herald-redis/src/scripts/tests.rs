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

fn check(name: &str, source: &str, keys: Vec<String>, argv: Vec<String>) {
    let (k, a) = header(source);
    assert_eq!(k, expected(keys), "{name}: KEYS in the header and the struct differ");
    assert_eq!(a, expected(argv), "{name}: ARGV in the header and the struct differ");
}

fn checked<S: ScriptArgs>(name: &str) {
    check(name, S::SOURCE, S::keys(), S::argv());
}

#[test]
fn lua_headers_match_the_argument_structs() {
    check("Append", Append::SOURCE, Append::keys(), Append::argv());
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
    assert_eq!(files, 25 + 2);
}

#[test]
fn gone_placeholders_are_filled() {
    let text = super::gone_text();
    assert!(!text.contains("${"), "a placeholder left in gone.lua: {text}");
}

/// A durable message of an `APPEND` run: its 11 arguments.
fn message(max_len: &str) -> Vec<String> {
    ["1", max_len, "0", "", "1", "{\"seq\":", ",\"ts\":", "}", "m-1", "0", "0"].map(str::to_owned).to_vec()
}

/// A volatile message of an `APPEND` run (`receipt_at`, then its receipt's
/// fingerprint and TTL if any).
fn volatile(rest: &[&str]) -> Vec<String> {
    let mut m = vec!["0".to_owned()];
    m.extend(rest.iter().map(|s| s.to_string()));
    m
}

/// Runs `APPEND` on channel `a` (a durable message) then `b` (`second`).
async fn append_two(
    con: &mut redis::aio::MultiplexedConnection,
    second: Vec<String>,
) -> redis::RedisResult<String> {
    let mut inv = super::APPEND.prepare_invoke();
    for k in ["a:meta", "a:log", "b:meta", "b:log"] {
        inv.key(k);
    }
    inv.arg("PUBLISH");
    inv.arg("e1").arg("chat:a").arg("a:fan").arg(1).arg(1);
    for a in message("0") {
        inv.arg(a);
    }
    inv.arg("e1").arg("chat:b").arg("b:fan").arg(3).arg(1);
    for a in second {
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
    // A volatile message: five arguments, seven with a receipt (its
    // fingerprint and TTL); anything else is refused as a whole.
    refused(&mut con, volatile(&["0", "m-2", "{\"ts\":"]), "short").await;
    refused(&mut con, volatile(&["5", "m-2", "{\"ts\":", "}"]), "receipt without its TTL").await;
    refused(&mut con, volatile(&["0", "", "{\"ts\":", "}"]), "no id").await;
    refused(&mut con, volatile(&["0", "m-2", "{\"ts\":", "}", "extra"]), "an argument too many").await;
    let lines = append_two(&mut con, volatile(&["0", "m-2", "{\"ts\":", "}"])).await.unwrap();
    let lines: Vec<&str> = lines.lines().collect();
    assert!(lines[0].starts_with("ok 1 "), "{lines:?}");
    assert!(lines[1].starts_with("ok - "), "{lines:?}");
    // And the limit applies: max_len 1 keeps one entry.
    append_two(&mut con, message("1")).await.unwrap();
    append_two(&mut con, message("1")).await.unwrap();
    let len: u32 = redis::cmd("XLEN").arg("b:log").query_async(&mut con).await.unwrap();
    assert_eq!(len, 1);
}
