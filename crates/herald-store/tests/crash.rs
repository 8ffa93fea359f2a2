//! `kill -9` during a stream of appends: every acknowledged append is there
//! after reopening, and each channel's head and log agree.
//!
//! The test re-runs its own binary as the child that appends (selected by an
//! environment variable), reads the child's acknowledgements from its
//! stdout, and kills it mid-stream.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;

use common::{channel, open, req};
use herald_core::Engine;

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
