use std::time::Duration;

use super::*;

fn parse(text: &str) -> Config {
    let loaded = Config::from_toml(text).unwrap();
    assert!(loaded.deprecations.is_empty(), "{:?}", loaded.deprecations);
    loaded.config
}

#[test]
fn defaults_validate_and_round_trip_through_toml() {
    let c = Config::default();
    c.validate().unwrap();
    let text = toml::to_string(&c).unwrap();
    let back = parse(&text);
    assert_eq!(back.listen, c.listen);
    assert_eq!(back.websocket.max_message_bytes, 64 * 1024);
    assert_eq!(back.namespaces, c.namespaces);
    assert_eq!(toml::to_string(&back).unwrap(), text);
}

#[test]
fn rejects_unknown_keys_and_bad_limits() {
    assert!(Config::from_toml("listen_addr = \"x\"").is_err());
    assert!(toml::from_str::<Config>("listen_addr = \"x\"").is_err());
    let mut c = Config::default();
    c.heartbeat.idle_timeout = Duration::from_secs(1);
    assert!(c.validate().unwrap_err().contains("idle_timeout"));
    let mut c = Config::default();
    c.websocket.outbox_bytes = c.websocket.max_message_bytes;
    assert!(c.validate().unwrap_err().contains("outbox_bytes"));
    let mut c = Config::default();
    c.websocket.total_outbox_bytes = c.websocket.outbox_bytes;
    assert!(c.validate().unwrap_err().contains("total_outbox_bytes"));
    let mut c = Config::default();
    c.websocket.max_publish_bytes_in_flight = 0;
    assert!(c.validate().unwrap_err().contains("max_publish_bytes_in_flight"));
    let mut c = Config::default();
    c.rate_limits.close_percent = 0;
    assert!(c.validate().unwrap_err().contains("rate_limits.close_percent"));
    let c = Config { api_keys: vec!["short".into()], ..Default::default() };
    assert!(c.validate().is_err());
    for depth in [0, herald_proto::MAX_DATA_DEPTH_LIMIT + 1] {
        let mut c = Config::default();
        c.publish.max_data_depth = depth;
        assert!(c.validate().unwrap_err().contains("max_data_depth"), "{depth}");
    }
    let mut c = Config::default();
    c.publish.max_data_depth = herald_proto::MAX_DATA_DEPTH_LIMIT;
    c.validate().unwrap();
}

#[test]
fn connection_bounds_and_origins_are_validated() {
    let mut c = Config::default();
    c.http.header_read_timeout = Duration::ZERO;
    assert!(c.validate().unwrap_err().contains("header_read_timeout"));
    let mut c = Config::default();
    c.http.max_header_bytes = 100_000;
    assert!(c.validate().unwrap_err().contains("max_header_bytes"));
    let mut c = Config::default();
    c.http.max_connections = 1;
    assert!(c.validate().unwrap_err().contains("http.max_connections"));
    let c = Config { cors_origins: vec!["app.example.com".into()], ..Default::default() };
    assert!(c.validate().unwrap_err().contains("cors_origins"));
    let c = parse("allowed_origins = [\"*\"]\n[http]\nkeep_alive_timeout = \"90s\"\n");
    assert_eq!(c.http.keep_alive_timeout, Duration::from_secs(90));
    c.validate().unwrap();
}

#[test]
fn redis_engine_settings_parse_and_validate() {
    let c = parse(
        "engine = \"redis\"\n[redis]\nurl = \"redis://a:1,redis://b:2\"\ncommand_timeout = \"500ms\"\nconnections = 4\n",
    );
    assert_eq!(c.engine, EngineKind::Redis);
    assert_eq!(c.redis.url, "redis://a:1,redis://b:2");
    assert_eq!(c.redis.command_timeout, Duration::from_millis(500));
    assert_eq!(c.redis.connections, 4);
    c.validate().unwrap();
    assert!(Config::from_toml("engine = \"memcached\"").is_err());
    let c = Config {
        engine: EngineKind::Redis,
        redis: RedisSettings { url: " , ".into(), ..Default::default() },
        ..Default::default()
    };
    assert!(c.validate().unwrap_err().contains("redis.url"));
}

#[test]
fn console_is_served_in_dev_mode_unless_set() {
    let mut c = Config::default();
    assert!(!c.console_enabled(), "auto without dev: off");
    c.dev = true;
    assert!(c.console_enabled(), "auto with dev: on");
    c.console = ConsoleSetting::Off;
    assert!(!c.console_enabled());
    let c = parse("console = \"on\"");
    assert!(c.console_enabled() && !c.dev);
    assert!(Config::from_toml("console = \"yes\"").is_err());
}

/// Every old key of [`RENAMED`], each with a value other than its default.
const OLD_LAYOUT: &str = r#"
redis_url = "redis://old:1"

[limits]
max_connections = 5000
max_http_connections = 300
header_read_timeout = "3s"
body_read_timeout = "4s"
http_idle_timeout = "5s"
max_header_bytes = 4096
max_body_bytes = 8192
max_message_bytes = 2048
outbox_capacity = 64
outbox_bytes = 65536
total_outbox_bytes = 1048576
max_subscriptions = 7
max_publishes_in_flight = 9
max_batch_channels = 11
max_history_limit = 13
max_data_depth = 15
client_frames_per_sec = 17
rate_limit_close_percent = 19
rate_limit_window = "21s"
error_replies_per_sec = 23
ping_interval = "6s"
idle_timeout = "30s"
shutdown_grace = "2s"
max_schedule_ahead = "1h"

[presence]
lease_ttl = "9s"

[storage]
max_batch = 33

[redis]
lease_ttl = "20s"

[namespaces.jobs]
delivery = "acked"
start = "head"

[[webhooks]]
name = "backend"
url = "http://127.0.0.1:9000/herald"
channels = ["jobs:*"]
secret = "0123456789abcdef0123456789abcdef"
max_batch = 7
start = "head"
lease_ttl = "40s"
"#;

/// The same settings in the current layout.
const NEW_LAYOUT: &str = r#"
[http]
max_connections = 300
header_read_timeout = "3s"
body_read_timeout = "4s"
keep_alive_timeout = "5s"
max_header_bytes = 4096
max_body_bytes = 8192

[websocket]
max_connections = 5000
max_message_bytes = 2048
outbox_capacity = 64
outbox_bytes = 65536
total_outbox_bytes = 1048576
max_subscriptions = 7
max_publishes_in_flight = 9

[rate_limits]
client_frames_per_sec = 17
close_percent = 19
close_window = "21s"
error_replies_per_sec = 23

[heartbeat]
ping_interval = "6s"
idle_timeout = "30s"

[publish]
max_batch_channels = 11
max_data_depth = 15
max_schedule_ahead = "1h"

[history]
max_limit = 13

[shutdown]
grace = "2s"

[presence]
member_lease_ttl = "9s"

[storage]
max_appends_per_commit = 33

[redis]
url = "redis://old:1"
node_lease_ttl = "20s"

[namespaces.jobs]
delivery = "acked"
new_subscriber_start = "head"

[[webhooks]]
name = "backend"
url = "http://127.0.0.1:9000/herald"
channels = ["jobs:*"]
secret = "0123456789abcdef0123456789abcdef"
max_messages_per_request = 7
new_channel_start = "head"
channel_lease_ttl = "40s"
"#;

#[test]
fn every_old_key_loads_to_the_new_layout_with_one_warning_each() {
    let old = Config::from_toml(OLD_LAYOUT).unwrap();
    let new = parse(NEW_LAYOUT);
    old.config.validate().unwrap();
    assert_eq!(toml::to_string(&old.config).unwrap(), toml::to_string(&new).unwrap());
    assert_ne!(toml::to_string(&new).unwrap(), toml::to_string(&Config::default()).unwrap());
    assert_eq!(old.deprecations.len(), RENAMED.len(), "{:?}", old.deprecations);
    let shown: Vec<String> = old.deprecations.iter().map(ToString::to_string).collect();
    assert!(
        shown.contains(&"config: `limits.ping_interval` is deprecated; use `heartbeat.ping_interval`".into())
    );
    assert!(shown.contains(&"config: `redis_url` is deprecated; use `redis.url`".into()));
    assert!(shown.contains(
        &"config: `namespaces.jobs.start` is deprecated; use `namespaces.jobs.new_subscriber_start`".into()
    ));
    assert!(shown.contains(
        &"config: `webhooks[0].lease_ttl` is deprecated; use `webhooks[0].channel_lease_ttl`".into()
    ));
}

#[test]
fn every_new_key_is_a_key_of_the_layout_and_no_old_key_is() {
    let printed: toml::Table = toml::from_str(&toml::to_string(&parse(NEW_LAYOUT)).unwrap()).unwrap();
    let lookup = |path: &str| {
        let mut at = toml::Value::Table(printed.clone());
        for seg in path.split('.') {
            at = match (at, seg) {
                (toml::Value::Table(mut t), "*") => t.remove("jobs").or_else(|| t.remove("backend"))?,
                (toml::Value::Array(mut a), "*") => a.swap_remove(0),
                (toml::Value::Table(mut t), key) => t.remove(key)?,
                _ => return None,
            };
        }
        Some(at)
    };
    for (old, new) in RENAMED {
        assert!(lookup(new).is_some(), "{new} is printed");
        assert!(lookup(old).is_none(), "{old} is not a key of the layout");
    }
}

#[test]
fn a_setting_given_both_ways_is_refused_with_its_line() {
    let e = Config::from_toml("[limits]\nping_interval = \"5s\"\n[heartbeat]\nping_interval = \"6s\"\n")
        .unwrap_err();
    assert!(e.message.contains("`limits.ping_interval` (deprecated) and `heartbeat.ping_interval`"), "{e}");
    assert_eq!(e.line, Some(4));
    let e = Config::from_toml("redis_url = \"redis://a\"\n[redis]\nurl = \"redis://b\"\n").unwrap_err();
    assert!(e.to_string().contains("redis.url"), "{e}");
}

#[test]
fn unknown_and_mistyped_keys_name_their_line() {
    let e = Config::from_toml("listen = \"127.0.0.1:0\"\n[limits]\nmax_mesage_bytes = 5\n").unwrap_err();
    assert!(e.message.contains("max_mesage_bytes"), "{e}");
    assert_eq!(e.line, Some(3));
    let e = Config::from_toml("[http]\nmax_mesage_bytes = 5\n").unwrap_err();
    assert!(e.message.contains("max_mesage_bytes"), "{e}");
    assert_eq!(e.line, Some(2));
    // A moved value keeps its place: the error points at the old key's line.
    let e = Config::from_toml("\n[limits]\nping_interval = 5\n").unwrap_err();
    assert_eq!(e.line, Some(3), "{e}");
    assert!(Config::from_toml("limits = 3").unwrap_err().message.contains("limits"));
    // An empty deprecated section is nothing to warn about.
    let loaded = Config::from_toml("[limits]\n").unwrap();
    assert!(loaded.deprecations.is_empty());
}

const CONFIGURATION_MD: &str = include_str!("../../../../docs/configuration.md");

#[test]
fn the_documented_old_key_table_is_the_one_in_the_code() {
    let show = |key: &str| match key.strip_prefix("webhooks.*.") {
        Some(k) => format!("[[webhooks]] {k}"),
        None => key.replace('*', "NAME"),
    };
    for (old, new) in RENAMED {
        let row = format!("| `{}` | `{}` |", show(old), show(new));
        assert!(CONFIGURATION_MD.contains(&row), "docs/configuration.md lists {row}");
    }
}

#[test]
fn the_documented_file_is_the_current_layout() {
    let section = CONFIGURATION_MD.find("## File\n").expect("the File section");
    let start =
        section + CONFIGURATION_MD[section..].find("```toml\n").expect("its example") + "```toml\n".len();
    let len = CONFIGURATION_MD[start..].find("```").unwrap();
    let loaded = Config::from_toml(&CONFIGURATION_MD[start..start + len]).unwrap();
    assert!(loaded.deprecations.is_empty(), "{:?}", loaded.deprecations);
}
