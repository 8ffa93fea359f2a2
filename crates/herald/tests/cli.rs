//! The README's commands through the real binary: `serve --dev`,
//! `publish`, `tail --since`, `config`, and a bad config's exit code.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_herald");

struct Served {
    child: std::process::Child,
    url: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve_dev(dir: &std::path::Path) -> Served {
    let child = Command::new(BIN)
        .args(["serve", "--dev", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .env("HERALD_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Owned by the guard first, so a failed read below still kills it.
    let mut served = Served { child, url: String::new() };
    let mut lines = BufReader::new(served.child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a banner line").unwrap();
    served.url = first.strip_prefix("herald listening on ").expect("the banner").trim().to_owned();
    std::thread::spawn(move || for _ in lines {});
    served
}

#[test]
fn publish_then_tail_from_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let srv = serve_dev(dir.path());
    for text in ["one", "two", "three"] {
        let out = Command::new(BIN)
            .args(["publish", "chat:demo", &format!(r#"{{"text":"{text}"}}"#), "--url", &srv.url])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(reply["channel"], "chat:demo");
    }
    let out = Command::new(BIN)
        .args(["tail", "chat:demo", "--since", "1", "--user", "me", "--count", "2", "--url", &srv.url])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let output = wait_with_timeout(out, Duration::from_secs(20));
    let lines: Vec<serde_json::Value> =
        output.lines().map(|l| serde_json::from_str(l).expect("one JSON message per line")).collect();
    assert_eq!(lines.len(), 2);
    assert_eq!((lines[0]["seq"].as_u64(), lines[1]["seq"].as_u64()), (Some(2), Some(3)));
    assert_eq!(lines[1]["data"]["text"], "three");

    // Not JSON: a clear error, nothing published.
    let out =
        Command::new(BIN).args(["publish", "chat:demo", "not json", "--url", &srv.url]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not valid JSON"));
}

fn wait_with_timeout(mut child: std::process::Child, limit: Duration) -> String {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("command did not finish in {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn config_prints_parseable_defaults() {
    let out = Command::new(BIN).arg("config").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let parsed: herald_server::Config =
        toml::from_str(&text).expect("`herald config` output is a valid config");
    assert_eq!(parsed.listen.to_string(), "127.0.0.1:8700");
    assert!(parsed.namespaces.0.contains_key("chat"));
    assert!(text.contains("[namespaces.live]"));
}

#[test]
fn invalid_config_is_one_line_and_exit_64() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("herald.toml");
    std::fs::write(&path, "listen = \"127.0.0.1:0\"\n[limits]\nmax_mesage_bytes = 5\n").unwrap();
    let out = Command::new(BIN).args(["serve", "--config"]).arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("max_mesage_bytes"), "{err}");
    let out = Command::new(BIN).args(["serve", "--listen", "nope"]).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    // Without --config, ./herald.toml is read if there is one.
    let out = Command::new(BIN).arg("serve").current_dir(dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(64), "./herald.toml was read");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("herald.toml") && err.contains("max_mesage_bytes"), "{err}");
}

#[test]
fn publish_at_or_in_schedules_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let srv = serve_dev(dir.path());
    let run = |extra: &[&str], data: &str| {
        let out = Command::new(BIN)
            .args(["publish", "chat:sched", data, "--url", &srv.url])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let a = run(&["--in", "300ms", "--idempotency-key", "k"], "1");
    assert!(a["scheduled_id"].is_string(), "{a}");
    assert!(a["deliver_at"].as_u64().unwrap() >= now + 300);
    assert_eq!(run(&["--in", "300ms", "--idempotency-key", "k"], "1")["replayed"], true);
    let b = run(&["--at", "2000-01-01T00:00:00Z"], "2");
    assert!(b["deliver_at"].as_u64().unwrap() >= now, "a past time means now");
    let c = run(&["--at", &(now + 500).to_string()], "3");
    assert_eq!(c["deliver_at"], now + 500);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let api = herald_client::HttpApi::anonymous(&srv.url);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let h = rt.block_on(api.history("chat:sched", None, None)).expect("history");
        let datas: Vec<String> = h.messages.iter().map(|m| m.data.get().to_owned()).collect();
        if datas.len() >= 3 {
            assert_eq!(datas, ["2", "1", "3"]);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "scheduled messages delivered: {datas:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn publish_batch_reads_json_lines_and_prints_a_result_each() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let srv = serve_dev(dir.path());
    let input = concat!(
        r#"{"channel":"chat:cli","data":{"n":1},"idempotency_key":"a"}"#,
        "\n",
        r#"{"channel":"nope:cli","data":2}"#,
        "\n\n",
        r#"{"channel":"chat:cli","data":3,"meta":{"k":"v"}}"#,
        "\n",
    );
    let run = || {
        let mut child = Command::new(BIN)
            .args(["publish-batch", "-", "--per-request", "2", "--url", &srv.url])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    };
    let out = run();
    assert!(!out.status.success(), "a failed message fails the command");
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 of 3 messages failed"));
    let lines: Vec<serde_json::Value> =
        out.stdout.lines().map(|l| serde_json::from_str(&l.unwrap()).unwrap()).collect();
    assert_eq!(lines.len(), 3, "one line per message, in order");
    assert_eq!((lines[0]["seq"].as_u64(), lines[2]["seq"].as_u64()), (Some(1), Some(2)));
    assert_eq!(lines[1]["error"]["code"], "unknown_namespace");
    let again = run();
    let lines: Vec<serde_json::Value> =
        again.stdout.lines().map(|l| serde_json::from_str(&l.unwrap()).unwrap()).collect();
    assert_eq!((lines[0]["seq"].as_u64(), lines[0]["replayed"].as_bool()), (Some(1), Some(true)));
    assert_eq!(lines[2]["seq"].as_u64(), Some(3), "no key: published again");
}

/// `herald users`, `herald channels` and `herald nodes` print the API's
/// replies; a refusal is the problem's detail on stderr.
#[test]
fn the_backend_verbs_act_on_users_and_list_the_deployment() {
    let dir = tempfile::tempdir().unwrap();
    let srv = serve_dev(dir.path());
    let run = |args: &[&str]| {
        let out = Command::new(BIN).args(args).args(["--url", &srv.url]).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let json = |s: &str| serde_json::from_str::<serde_json::Value>(s).expect("JSON on stdout");
    let (ok, out, err) = run(&["users", "connections", "amy"]);
    assert!(ok, "{err}");
    assert_eq!(json(&out), serde_json::json!([]));
    let (ok, out, err) = run(&["users", "disconnect", "amy", "--no-reconnect", "--ban", "60"]);
    assert!(ok, "{err}");
    assert!(json(&out)["banned_until_ms"].as_u64().is_some(), "{out}");
    let (ok, out, _) = run(&["users", "revoke", "amy"]);
    assert!(ok);
    assert!(json(&out)["issued_before_ms"].as_u64().is_some());
    let (ok, _, err) = run(&["users", "subscribe", "amy", "nope:1"]);
    assert!(!ok && err.contains("unknown_namespace"), "a clear refusal: {err}");
    let (ok, out, _) = run(&["nodes"]);
    assert!(ok);
    assert_eq!(json(&out).as_array().map(Vec::len), Some(1), "{out}");
    let (ok, out, _) = run(&["channels", "--pattern", "chat:*"]);
    assert!(ok);
    assert_eq!(json(&out)["channels"], serde_json::json!([]));
}
