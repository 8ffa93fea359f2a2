//! Reloading the configuration of a running node (SIGHUP, or `POST
//! /api/v1/admin/reload`): API keys, JWT keys, namespaces, limits,
//! webhooks and the log level change live while every connection stays
//! up; an invalid file, a change to a key that needs a restart, or a
//! namespace removed under its subscribers is refused, named, counted,
//! and changes nothing.

mod webhook_backend;

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

/// Like [`spawn`], with stderr in [`HeraldProcess::log`] and the log
/// filter from the file's `log` (no `HERALD_LOG`).
fn spawn_logged(body: &str) -> (HeraldProcess, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("herald.toml");
    write_config(&file, body);
    let log = std::fs::File::create(HeraldProcess::log_path(&dir)).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
    cmd.args(["serve", "--dev", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--config")
        .arg(&file)
        .env_remove("HERALD_API_KEYS")
        .env_remove("HERALD_LOG")
        .stderr(log);
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
    let bad = config(NEW, "[websocket]\nno_such_key = 1\n");
    write_config(&file, &bad);
    let (status, body) = reload(&herald.url, OLD).await;
    assert_eq!(status, 409, "{body}");
    let detail = body["detail"].as_str().unwrap_or_default().to_owned();
    assert!(detail.contains("invalid configuration") && detail.contains("no_such_key"), "{body}");
    // The same words a start with this file prints before exiting 64.
    let start = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&file)
        .env_remove("HERALD_API_KEYS")
        .output()
        .unwrap();
    assert_eq!(start.status.code(), Some(64));
    let printed = String::from_utf8_lossy(&start.stderr).trim().to_owned();
    assert_eq!(printed, format!("herald: {detail}"), "the reload's error is the start's");
    // Nothing changed: the old key still works, the new one does not.
    assert_eq!(publish(&herald.url, OLD, "chat:x", json!(1)).await, 201);
    assert_eq!(publish(&herald.url, NEW, "chat:x", json!(1)).await, 401);
    assert!(metrics(&herald.url).await.contains(r#"herald_reloads_total{result="refused"} 1"#));
}

#[tokio::test]
async fn a_reload_adds_a_namespace_and_raises_a_limit_while_connections_stay_up() {
    let before = "[websocket]\nmax_message_bytes = 1024\n[namespaces.chat]\ndelivery = \"durable\"\n";
    let (herald, file) = spawn(&config(OLD, before));
    let mut conn = Connection::connect(&ConnectOptions::dev_user(&herald.url, "ann")).await.expect("connect");
    conn.subscribe("chat:a", None).await.unwrap();
    assert_eq!(publish(&herald.url, OLD, "news:a", json!("early")).await, 404, "no such namespace yet");
    let big = "x".repeat(2000);
    assert_eq!(publish(&herald.url, OLD, "chat:a", json!(big)).await, 413);

    let after = "[websocket]\nmax_message_bytes = 4096\n[namespaces.chat]\ndelivery = \"durable\"\n\
                 [namespaces.news]\ndelivery = \"durable\"\n";
    write_config(&file, &config(OLD, after));
    let (status, body) = reload(&herald.url, OLD).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["changed"], json!(["namespaces.news", "websocket.max_message_bytes"]));

    // The connection opened before the reload subscribes to the new
    // namespace, and gets a message only the new limit lets through.
    conn.subscribe("news:a", None).await.expect("the new namespace is subscribable");
    assert_eq!(publish(&herald.url, OLD, "news:a", json!("fresh")).await, 201);
    assert_eq!(data(&mut conn).await, json!("fresh"));
    assert_eq!(publish(&herald.url, OLD, "chat:a", json!(big)).await, 201, "the new limit is in force");
    assert_eq!(data(&mut conn).await, json!(big));
}

#[tokio::test]
async fn a_namespace_removed_under_its_subscribers_is_refused_by_name() {
    let both = "[namespaces.chat]\ndelivery = \"durable\"\n[namespaces.news]\ndelivery = \"volatile\"\n";
    let (herald, file) = spawn(&config(OLD, both));
    let mut conn = Connection::connect(&ConnectOptions::dev_user(&herald.url, "ann")).await.expect("connect");
    conn.subscribe("news:a", None).await.unwrap();
    write_config(&file, &config(OLD, "[namespaces.chat]\ndelivery = \"durable\"\n"));
    let (status, body) = reload(&herald.url, OLD).await;
    assert_eq!(status, 409, "{body}");
    assert!(body.to_string().contains("namespace `news` is removed but 1 of its channels"), "{body}");
    assert_eq!(publish(&herald.url, OLD, "news:a", json!("still")).await, 202, "nothing changed");
    assert_eq!(data(&mut conn).await, json!("still"));
    // Once nobody here is subscribed, the same file applies.
    drop(conn);
    assert_eventually("the reload applies once the subscribers left", || async {
        reload(&herald.url, OLD).await.0 == 200
    })
    .await;
    assert_eq!(publish(&herald.url, OLD, "news:a", json!(1)).await, 404, "news is gone");
}

#[tokio::test]
async fn a_reload_changes_the_log_level() {
    let (herald, file) = spawn_logged(&config(OLD, "log = \"warn\"\n"));
    // At warn, an applied reload's info line is not written.
    write_config(&file, &config(NEW, "log = \"warn\"\n"));
    assert_eq!(reload(&herald.url, OLD).await.0, 200);
    assert!(!herald.log().contains("configuration reloaded"), "{}", herald.log());
    write_config(&file, &config(NEW, "log = \"info\"\n"));
    assert_eq!(reload(&herald.url, NEW).await.0, 200);
    assert_eventually("info lines are written", || async { herald.log().contains("configuration reloaded") })
        .await;
    // An unparsable filter is refused like any invalid file.
    write_config(&file, &config(NEW, "log = \"info,[\"\n"));
    let (status, body) = reload(&herald.url, NEW).await;
    assert_eq!(status, 409, "{body}");
    assert!(body.to_string().contains("log / HERALD_LOG"), "{body}");
}

#[tokio::test]
async fn a_reload_adds_a_webhook_that_delivers_what_follows() {
    let secret = "a-webhook-secret-of-at-least-32-bytes";
    let backend = webhook_backend::Backend::start(secret).await;
    let (herald, file) = spawn(&config(OLD, ""));
    let mut conn = Connection::connect(&ConnectOptions::dev_user(&herald.url, "ann")).await.expect("connect");
    conn.subscribe("chat:hooked", None).await.unwrap();
    let hook = format!(
        "[[webhooks]]\nname = \"backend\"\nurl = \"{}\"\nchannels = [\"chat:*\"]\nsecret = \"{secret}\"\n\
         new_channel_start = \"oldest\"\npoll_interval = \"200ms\"\n",
        backend.url
    );
    write_config(&file, &config(OLD, &hook));
    let (status, body) = reload(&herald.url, OLD).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["changed"], json!(["webhooks"]));
    assert_eq!(publish(&herald.url, OLD, "chat:hooked", json!(1)).await, 201);
    assert_eq!(publish(&herald.url, OLD, "chat:hooked", json!(2)).await, 201);
    assert_eventually("the new webhook delivered both", || async {
        backend.accepted("chat:hooked").concat() == [1, 2]
    })
    .await;
    assert_eq!(data(&mut conn).await, json!(1), "the connection stayed up");
    assert_eq!(data(&mut conn).await, json!(2));
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

/// A token signed with `secret` under `kid`.
fn kid_token(kid: &str, secret: &str, sub: &str) -> String {
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.kid = Some(kid.into());
    let claims = json!({ "sub": sub, "exp": now_secs() + 300, "channels": ["chat:*"] });
    jsonwebtoken::encode(&header, &claims, &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()))
        .unwrap()
}

/// Connect with `token`: whether the upgrade was accepted.
async fn accepted(url: &str, token: &str) -> bool {
    Connection::connect(&ConnectOptions::token(url, token)).await.is_ok()
}

#[tokio::test]
async fn jwt_keys_rotate_by_kid_through_reloads_without_dropping_a_connection() {
    const A: &str = "the-first-signing-secret-of-32-bytes!";
    const B: &str = "the-second-signing-secret-of-32-bytes";
    let key = |kid: &str, secret: &str| {
        format!("[[jwt.keys]]\nkid = \"{kid}\"\nalg = \"HS256\"\nsecret = \"{secret}\"\n")
    };
    let (herald, file) = spawn(&config(OLD, &key("a", A)));
    let mut conn =
        Connection::connect(&ConnectOptions::token(&herald.url, kid_token("a", A, "ann"))).await.unwrap();
    assert!(!accepted(&herald.url, &kid_token("b", B, "bob")).await, "b is not a key yet");
    // The new key beside the old one: both verify.
    write_config(&file, &config(OLD, &format!("{}{}", key("a", A), key("b", B))));
    assert_eq!(reload(&herald.url, OLD).await.0, 200);
    assert!(accepted(&herald.url, &kid_token("b", B, "bob")).await);
    assert!(accepted(&herald.url, &kid_token("a", A, "cat")).await);
    // The old key withdrawn: its tokens are refused, b's still verify.
    write_config(&file, &config(OLD, &key("b", B)));
    assert_eq!(reload(&herald.url, OLD).await.0, 200);
    assert!(!accepted(&herald.url, &kid_token("a", A, "dan")).await);
    assert!(accepted(&herald.url, &kid_token("b", B, "eve")).await);
    // The connection that came in with a's token is still up.
    assert_eq!(conn.ping().await.unwrap().kind, "pong");
}
