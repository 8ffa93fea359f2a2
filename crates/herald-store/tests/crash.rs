//! `kill -9` during a stream of appends: every acknowledged append is there
//! after reopening, and each channel's head and log agree. The same for a
//! stream of acks (cursor updates), which are committed without an fsync:
//! every cursor is at least what the child was told; and for presence
//! joins (also committed without an fsync).
//!
//! Each test re-runs its own binary as the child that writes (selected by
//! an environment variable), reads the child's acknowledgements from its
//! stdout, and kills it mid-stream.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;

use common::{channel, open, req};
use herald_core::{Cursors, Lifecycle, Log, Presence, SubscriberId};

const CHILD_ENV: &str = "HERALD_STORE_CRASH_CHILD_DIR";
const CHANNELS: usize = 4;
/// Acks to see before killing the child.
const KILL_AFTER_ACKS: usize = 400;

#[test]
fn acknowledged_appends_survive_kill_9() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(dir.into());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "acknowledged_appends_survive_kill_9", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut acked: HashMap<String, u64> = HashMap::new();
    let mut seen = 0;
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        let Some(rest) = line.strip_prefix("ack ") else { continue };
        let (ch, seq) = rest.split_once(' ').unwrap();
        let seq: u64 = seq.parse().unwrap();
        let top = acked.entry(ch.to_owned()).or_default();
        *top = (*top).max(seq);
        seen += 1;
        if seen == KILL_AFTER_ACKS {
            break;
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert_eq!(seen, KILL_AFTER_ACKS, "the child stopped early");

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let engine = open(dir.path(), |_| {});
        let mut stored = 0;
        for (name, top) in &acked {
            let ch = channel(name);
            let page = engine.read(&ch, 0, usize::MAX).await.unwrap();
            let head = page.position.head;
            assert!(head >= *top, "{name}: acked seq {top} lost (head {head})");
            let seqs: Vec<u64> = page.messages.iter().map(|m| m.seq.unwrap()).collect();
            assert_eq!(seqs, (1..=head).collect::<Vec<_>>(), "{name}: the log matches its head");
            stored += head;
        }
        assert!(stored >= KILL_AFTER_ACKS as u64, "{stored} stored, {KILL_AFTER_ACKS} acknowledged");
        engine.close().await;
    });
}

/// Append forever from 16 tasks, printing each acknowledged seq.
fn child(dir: std::path::PathBuf) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let engine = Arc::new(open(&dir, |_| {}));
        let out = Arc::new(std::sync::Mutex::new(std::io::stdout()));
        let tasks: Vec<_> = (0..16)
            .map(|t| {
                let (engine, out) = (engine.clone(), out.clone());
                tokio::spawn(async move {
                    let ch = channel(&format!("crash:{}", t % CHANNELS));
                    loop {
                        let r = engine.append(req(&ch, "{\"payload\":\"xxxxxxxxxxxxxxxx\"}")).await.unwrap();
                        let mut out = out.lock().unwrap();
                        writeln!(out, "ack {} {}", ch, r.seq.unwrap()).unwrap();
                        out.flush().unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            let _ = t.await;
        }
    });
}

const ACK_CHILD_ENV: &str = "HERALD_STORE_CRASH_ACK_CHILD_DIR";
/// Messages per channel the ack child appends before acking them.
const ACK_MESSAGES: u64 = 300;
const ACKERS: usize = 16;
/// Confirmed acks to see before killing the ack child.
const KILL_AFTER_CURSOR_ACKS: usize = 1500;

#[test]
fn confirmed_acks_survive_kill_9() {
    if let Ok(dir) = std::env::var(ACK_CHILD_ENV) {
        ack_child(dir.into());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "confirmed_acks_survive_kill_9", "--nocapture", "--test-threads=1"])
        .env(ACK_CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    // (channel, subscriber key) -> highest cursor the child was told.
    let mut confirmed: HashMap<(String, String), u64> = HashMap::new();
    let mut seen = 0;
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        let Some(rest) = line.strip_prefix("cursor ") else { continue };
        let mut parts = rest.splitn(3, ' ');
        let (ch, seq, sub) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
        let top = confirmed.entry((ch.to_owned(), sub.to_owned())).or_default();
        *top = (*top).max(seq.parse().unwrap());
        seen += 1;
        if seen == KILL_AFTER_CURSOR_ACKS {
            break;
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert_eq!(seen, KILL_AFTER_CURSOR_ACKS, "the child stopped early");

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let engine = open(dir.path(), |_| {});
        for ((name, key), top) in &confirmed {
            let sub = SubscriberId::parse_key(key).unwrap();
            let cursor = engine.cursor(&channel(name), &sub).await.unwrap();
            let seq = cursor.map_or(0, |c| c.seq);
            assert!(seq >= *top, "{name} {sub:?}: confirmed cursor {top} lost (stored {seq})");
            assert!(seq <= ACK_MESSAGES, "{name} {sub:?}: cursor {seq} beyond the head");
        }
        assert_eq!(confirmed.len(), ACKERS, "every acker confirmed something");
        engine.close().await;
    });
}

/// Append `ACK_MESSAGES` to each channel, then ack them one by one from
/// `ACKERS` subscribers, printing each confirmed cursor. No fsync helps the
/// acks: the ack-sync timer is set far in the future and nothing else
/// fsyncs once the appends are done.
fn ack_child(dir: std::path::PathBuf) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let engine =
            Arc::new(open(&dir, |c| c.ack_sync_interval = std::time::Duration::from_secs(24 * 3600)));
        for c in 0..CHANNELS {
            let ch = channel(&format!("user:{c}"));
            for _ in 0..ACK_MESSAGES {
                engine.append(req(&ch, "1")).await.unwrap();
            }
        }
        let out = Arc::new(std::sync::Mutex::new(std::io::stdout()));
        let tasks: Vec<_> = (0..ACKERS)
            .map(|t| {
                let (engine, out) = (engine.clone(), out.clone());
                tokio::spawn(async move {
                    let ch = channel(&format!("user:{}", t % CHANNELS));
                    let sub = SubscriberId::new(format!("{}", t % CHANNELS), Some(format!("dev {t}").into()))
                        .unwrap();
                    for seq in 1..=ACK_MESSAGES {
                        let state = engine.ack(&ch, &sub, seq).await.unwrap();
                        let mut out = out.lock().unwrap();
                        writeln!(out, "cursor {} {} {}", ch, state.seq, sub.key()).unwrap();
                        out.flush().unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            let _ = t.await;
        }
        // Wait to be killed: a clean exit would flush and fsync.
        std::future::pending::<()>().await;
    });
}

const PRESENCE_CHILD_ENV: &str = "HERALD_STORE_CRASH_PRESENCE_CHILD_DIR";
const JOINERS: usize = 8;
/// Confirmed joins to see before killing the presence child.
const KILL_AFTER_JOINS: usize = 1000;

/// Presence writes are committed without an fsync, like acks: a join the
/// child was told about survives `kill -9`, with a token at least as high
/// (a later, unconfirmed join may have taken over), and the token counter
/// stays above every token handed out.
#[test]
fn confirmed_presence_joins_survive_kill_9() {
    if let Ok(dir) = std::env::var(PRESENCE_CHILD_ENV) {
        presence_child(dir.into());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "confirmed_presence_joins_survive_kill_9", "--nocapture", "--test-threads=1"])
        .env(PRESENCE_CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    // member index -> highest token the child was told.
    let mut confirmed: HashMap<usize, u64> = HashMap::new();
    let mut seen = 0;
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        let Some(rest) = line.strip_prefix("joined ") else { continue };
        let (i, token) = rest.split_once(' ').unwrap();
        let top = confirmed.entry(i.parse().unwrap()).or_default();
        *top = (*top).max(token.parse().unwrap());
        seen += 1;
        if seen == KILL_AFTER_JOINS {
            break;
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert_eq!(seen, KILL_AFTER_JOINS, "the child stopped early");

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let engine = open(dir.path(), |_| {});
        let ch = channel("room:crash");
        let leases = engine.presence(&ch, 100).await.unwrap();
        assert_eq!(leases.len(), confirmed.len(), "every confirmed member is present");
        for (i, top) in &confirmed {
            let key = herald_core::member_key(&presence_member(*i));
            let lease = leases.iter().find(|l| l.key() == key).unwrap_or_else(|| panic!("member {i} lost"));
            assert!(lease.token >= *top, "member {i}: confirmed token {top} lost (stored {})", lease.token);
        }
        let highest = confirmed.values().max().copied().unwrap_or(0);
        let newcomer = presence_member(JOINERS);
        let next = engine.presence_join(&ch, &newcomer, std::time::Duration::from_secs(60)).await.unwrap();
        assert!(next.lease().token > highest, "token {} reissued (confirmed {highest})", next.lease().token);
        engine.close().await;
    });
}

fn presence_member(i: usize) -> herald_core::Member {
    herald_core::Member { client_id: format!("c{i}"), user: format!("u{i}"), device: None, info: None }
}

/// Rejoin `JOINERS` members over and over (each join reclaims the member
/// with a new token), printing each confirmed token. As in `ack_child`, no
/// fsync helps: the ack-sync timer is set far in the future.
fn presence_child(dir: std::path::PathBuf) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let engine =
            Arc::new(open(&dir, |c| c.ack_sync_interval = std::time::Duration::from_secs(24 * 3600)));
        let out = Arc::new(std::sync::Mutex::new(std::io::stdout()));
        let tasks: Vec<_> = (0..JOINERS)
            .map(|i| {
                let (engine, out) = (engine.clone(), out.clone());
                tokio::spawn(async move {
                    let ch = channel("room:crash");
                    let m = presence_member(i);
                    loop {
                        let ttl = std::time::Duration::from_secs(3600);
                        let joined = engine.presence_join(&ch, &m, ttl).await.unwrap();
                        let mut out = out.lock().unwrap();
                        writeln!(out, "joined {i} {}", joined.lease().token).unwrap();
                        out.flush().unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            let _ = t.await;
        }
    });
}
