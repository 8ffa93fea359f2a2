//! A configuration file of the earlier layout through the real binary:
//! it still starts the server, with one warning per old key naming the new
//! one, and a setting given both ways is refused with exit 64.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_herald");

#[test]
fn old_keys_start_the_server_with_one_warning_each() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("herald.toml");
    std::fs::write(
        &path,
        "redis_url = \"redis://127.0.0.1:1\"\n[limits]\nping_interval = \"5s\"\nidle_timeout = \"20s\"\n\
         [presence]\nlease_ttl = \"3s\"\n",
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--dev", "--listen", "127.0.0.1:0", "--config"])
        .arg(&path)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("HERALD_LOG", "warn")
        .env_remove("HERALD_CONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let banner = BufReader::new(child.stdout.take().unwrap()).lines().next().map(|l| l.unwrap());
    let _ = child.kill();
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    let _ = child.wait();
    assert!(banner.is_some_and(|l| l.starts_with("herald listening on ")), "served; stderr: {stderr}");
    for (old, new) in [
        ("redis_url", "redis.url"),
        ("limits.ping_interval", "heartbeat.ping_interval"),
        ("limits.idle_timeout", "heartbeat.idle_timeout"),
        ("presence.lease_ttl", "presence.member_lease_ttl"),
    ] {
        let line = format!("config: `{old}` is deprecated; use `{new}`");
        assert_eq!(stderr.matches(&line).count(), 1, "{line} once in: {stderr}");
    }
}

#[test]
fn a_setting_given_both_ways_exits_64_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("herald.toml");
    std::fs::write(&path, "[limits]\nping_interval = \"5s\"\n\n[heartbeat]\nping_interval = \"6s\"\n")
        .unwrap();
    let out = Command::new(BIN).args(["serve", "--config"]).arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("`limits.ping_interval`") && err.contains("`heartbeat.ping_interval`"), "{err}");
    assert!(err.contains("(line 5)"), "{err}");
}
