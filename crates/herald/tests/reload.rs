//! Reloading the configuration of a running node (SIGHUP, or `POST
//! /api/v1/admin/reload`): API keys and JWT keys change live while every
//! connection stays up; an invalid file, or a change to a key that needs
//! a restart, is refused, named, counted, and changes nothing.

use std::path::Path;
use std::process::{Command, Stdio};

use herald_client::{ConnectOptions, Connection};
use herald_test_support::*;
use serde_json::{json, Value};

const OLD: &str = "old-api-key-0123456789";
const NEW: &str = "new-api-key-0123456789";

fn write_config(path: &Path, body: &str) {
    std::fs::write(path, body).unwrap();
}

fn config(key: &str, extra: &str) -> String {
    format!("api_keys = [\"{key}\"]\n{extra}")
}

/// A `herald serve --dev --config FILE`, its config file.
fn spawn(body: &str) -> (HeraldProcess, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("herald.toml");
    write_config(&file, body);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
    cmd.args(["serve", "--dev", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--config")
        .arg(&file)
        .env_remove("HERALD_API_KEYS")
        .env("HERALD_LOG", "warn")
        .stderr(Stdio::inherit());
    (HeraldProcess::spawn(&mut cmd, Some(dir)), file)
}

/// Publish `data` on `channel` with `key`: the status.
async fn publish(url: &str, key: &str, channel: &str, data: Value) -> u16 {
    let r = reqwest::Client::new()
        .post(format!("{url}/api/v1/channels/{channel}/messages"))
        .bearer_auth(key)
        .json(&json!({ "data": data }))
        .send()
        .await
        .expect("publish");
    r.status().as_u16()
}

/// `POST /api/v1/admin/reload` with `key`: status and body.
async fn reload(url: &str, key: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{url}/api/v1/admin/reload"))
        .bearer_auth(key)
        .send()
        .await
        .expect("reload");
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// The data of the next message on `conn`.
async fn data(conn: &mut Connection) -> Value {
    let m = next_message(conn).await;
    serde_json::from_str(m.data.expect("data").get()).unwrap()
}

async fn metrics(url: &str) -> String {
    reqwest::get(format!("{url}/metrics")).await.unwrap().text().await.unwrap()
}

#[tokio::test]
async fn sighup_swaps_the_api_keys_while_a_connection_stays_up() {
    let (herald, file) = spawn(&config(OLD, ""));
    let mut conn = Connection::connect(&ConnectOptions::dev_user(&herald.url, "ann")).await.expect("connect");
    conn.subscribe("chat:reload", None).await.unwrap();
    assert_eq!(publish(&herald.url, OLD, "chat:reload", json!(1)).await, 201);
    assert_eq!(publish(&herald.url, NEW, "chat:reload", json!("refused")).await, 401);

    write_config(&file, &config(NEW, ""));
    signal(herald.pid, "HUP");
    assert_eventually("the new key is accepted", || async {
        publish(&herald.url, NEW, "chat:reload", json!(2)).await == 201
    })
    .await;
    assert_eq!(publish(&herald.url, OLD, "chat:reload", json!("refused")).await, 401, "the old key is gone");

    // The connection opened before the reload got both messages, in order.
    let seen = vec![data(&mut conn).await, data(&mut conn).await];
    assert_eq!(seen, [json!(1), json!(2)]);
    assert!(metrics(&herald.url).await.contains(r#"herald_reloads_total{result="applied"} 1"#));
}

#[tokio::test]
async fn an_invalid_file_is_refused_with_the_start_error_and_changes_nothing() {
    let (herald, file) = spawn(&config(OLD, ""));
    write_config(&file, &config(NEW, "[websocket]\nno_such_key = 1\n"));
    let (status, body) = reload(&herald.url, OLD).await;
    assert_eq!(status, 409, "{body}");
    let detail = body.to_string();
    assert!(detail.contains("invalid configuration") && detail.contains("no_such_key"), "{body}");
    // Nothing changed: the old key still works, the new one does not.
    assert_eq!(publish(&herald.url, OLD, "chat:x", json!(1)).await, 201);
    assert_eq!(publish(&herald.url, NEW, "chat:x", json!(1)).await, 401);
    assert!(metrics(&herald.url).await.contains(r#"herald_reloads_total{result="refused"} 1"#));
}

#[tokio::test]
async fn a_key_that_needs_a_restart_is_named_and_nothing_changes() {
    let (herald, file) = spawn(&config(OLD, ""));
    let mut conn = Connection::connect(&ConnectOptions::dev_user(&herald.url, "bo")).await.expect("connect");
    conn.subscribe("chat:fixed", None).await.unwrap();
    write_config(&file, &config(NEW, "[websocket]\nmax_connections = 7\n"));
    let (status, body) = reload(&herald.url, OLD).await;
    assert_eq!(status, 409, "{body}");
    let detail = body.to_string();
    assert!(detail.contains("websocket.max_connections"), "the key is named: {body}");
    assert!(!detail.contains("api_keys"), "a live key is not a reason: {body}");
    assert_eq!(publish(&herald.url, NEW, "chat:fixed", json!(1)).await, 401, "the API keys did not change");
    // A file with only live changes applies, and names what changed.
    write_config(&file, &config(NEW, ""));
    let (status, body) = reload(&herald.url, OLD).await;
    assert_eq!((status, body["changed"].clone()), (200, json!(["api_keys"])), "{body}");
    assert_eq!(publish(&herald.url, NEW, "chat:fixed", json!(2)).await, 201);
    assert_eq!(data(&mut conn).await, json!(2), "the connection stayed up");
}
