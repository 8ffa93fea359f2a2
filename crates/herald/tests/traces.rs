//! OpenTelemetry traces over OTLP/HTTP (protobuf), received by a collector
//! the test runs: with `OTEL_EXPORTER_OTLP_ENDPOINT` set, an HTTP publish
//! continues the caller's `traceparent` with its engine append under it; a
//! socket publish, a subscribe with its catch-up, the fan-out, a webhook
//! delivery and a proxy call are spans; webhook and proxy requests carry
//! the `traceparent` of their span; no attribute holds a key, a token or
//! a message body; `OTEL_TRACES_SAMPLER=always_off` exports nothing.

mod webhook_backend;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_client::{ConnectOptions, Connection};
use herald_test_support::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message as _;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

const SECRET: &str = "a-webhook-and-proxy-secret-0123456789";
const BODY_MARKER: &str = "body-marker-never-in-a-span";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// One request the collector got: path, lower-cased headers, body.
#[derive(Clone)]
struct Request {
    path: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

/// A collector, webhook backend and proxy backend in one: answers every
/// request (`{"allow": true}` on `/subscribe`, empty otherwise) and keeps it.
struct Collector {
    url: String,
    seen: Arc<Mutex<Vec<Request>>>,
}

impl Collector {
    async fn start() -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen: Arc<Mutex<Vec<Request>>> = Arc::default();
        let keep = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let keep = keep.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    while let Some((head, body)) = webhook_backend::read_request(&mut s, &mut buf).await {
                        let mut lines = head.lines();
                        let path = lines.next().unwrap_or("").split(' ').nth(1).unwrap_or("").to_owned();
                        let headers = lines
                            .filter_map(|l| l.split_once(':'))
                            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
                            .collect();
                        let answer: &[u8] =
                            if path.ends_with("/subscribe") { br#"{"allow":true}"# } else { b"" };
                        keep.lock().unwrap().push(Request { path, headers, body });
                        let resp = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                            answer.len()
                        );
                        if s.write_all(resp.as_bytes()).await.is_err() || s.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Collector { url, seen }
    }

    fn requests(&self, path: &str) -> Vec<Request> {
        self.seen.lock().unwrap().iter().filter(|r| r.path == path).cloned().collect()
    }

    /// Every span exported so far.
    fn spans(&self) -> Vec<Span> {
        let mut out = Vec::new();
        for r in self.requests("/v1/traces") {
            let req = ExportTraceServiceRequest::decode(&r.body[..]).expect("OTLP protobuf");
            for rs in req.resource_spans {
                let service = rs
                    .resource
                    .iter()
                    .flat_map(|r| &r.attributes)
                    .find(|a| a.key == "service.name")
                    .and_then(|a| text(a.value.as_ref()?.value.as_ref()?));
                for ss in rs.scope_spans {
                    for s in ss.spans {
                        out.push(Span {
                            name: s.name,
                            trace: hex(&s.trace_id),
                            id: hex(&s.span_id),
                            parent: hex(&s.parent_span_id),
                            attributes: s
                                .attributes
                                .iter()
                                .map(|a| {
                                    let v = a
                                        .value
                                        .as_ref()
                                        .and_then(|v| v.value.as_ref())
                                        .map_or(String::new(), |v| {
                                            text(v).unwrap_or_else(|| format!("{v:?}"))
                                        });
                                    (a.key.clone(), v)
                                })
                                .collect(),
                            service: service.clone().unwrap_or_default(),
                        });
                    }
                }
            }
        }
        out
    }
}

#[derive(Debug, Clone)]
struct Span {
    name: String,
    trace: String,
    id: String,
    parent: String,
    attributes: HashMap<String, String>,
    service: String,
}

fn text(v: &AnyValue) -> Option<String> {
    match v {
        AnyValue::StringValue(s) => Some(s.clone()),
        AnyValue::IntValue(i) => Some(i.to_string()),
        _ => None,
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A `herald serve` exporting to `collector`, with a webhook and a
/// subscribe proxy pointing at it too.
fn spawn(collector: &Collector, env: &[(&str, &str)]) -> HeraldProcess {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("herald.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[[webhooks]]
name = "backend"
url = "{url}/hook"
channels = ["chat:*"]
secret = "{SECRET}"

[proxies.subscribe]
url = "{url}/subscribe"
secret = "{SECRET}"
namespaces = ["chat"]
cache = "0s"
"#,
            url = collector.url
        ),
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
    cmd.args(["serve", "--dev", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("HERALD_API_KEYS", API_KEY)
        .env("HERALD_LOG", "warn")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.url)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env_remove("OTEL_SERVICE_NAME")
        .env_remove("OTEL_TRACES_SAMPLER")
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    HeraldProcess::spawn(&mut cmd, Some(dir))
}

async fn publish_traced(herald: &HeraldProcess, channel: &str, traceparent: &str) -> u16 {
    reqwest::Client::new()
        .post(format!("{}/api/v1/channels/{channel}/messages", herald.url))
        .bearer_auth(API_KEY)
        .header("traceparent", traceparent)
        .json(&json!({ "data": { "text": BODY_MARKER } }))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn spans_reach_the_collector_and_the_trace_runs_through_webhooks_and_proxies() {
    let collector = Collector::start().await;
    let herald = spawn(&collector, &[]);

    // An HTTP publish continuing the caller's trace.
    let caller = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    assert_eq!(publish_traced(&herald, "chat:traced", &caller).await, 201);
    // A subscribe (asking the proxy) with a catch-up, as an SSE stream.
    let url = format!("{}/sse?channel=chat:traced&user=reader&from=first", herald.url);
    let mut stream = SseStream::open(&reqwest::Client::new(), &url, None).await.stream();
    assert_eq!(stream.messages(1).await[0]["data"]["text"], BODY_MARKER);
    // A socket publish.
    let mut ws = Connection::connect(&ConnectOptions::dev_user(&herald.url, "writer")).await.unwrap();
    ws.publish("live:traced", &json!({ "text": BODY_MARKER }), None).await.unwrap();

    let wanted = [
        "herald.publish",
        "herald.append",
        "herald.fanout",
        "herald.subscribe",
        "herald.proxy",
        "herald.catchup",
        "herald.webhook",
        "herald.socket_publish",
    ];
    let spans = eventually("every kind of span exported", || async {
        let spans = collector.spans();
        wanted.iter().all(|w| spans.iter().any(|s| s.name == *w)).then_some(spans)
    })
    .await;
    let one = |name: &str| spans.iter().find(|s| s.name == name).cloned().unwrap();
    assert!(spans.iter().all(|s| s.service == "herald"), "service.name defaults to herald");

    let publish =
        spans.iter().find(|s| s.name == "herald.publish" && s.trace == TRACE_ID).expect("the caller's trace");
    assert_eq!(publish.parent, CALLER_SPAN, "a child of the caller's span");
    assert_eq!(publish.attributes.get("channel").map(String::as_str), Some("chat:traced"));
    let append = spans
        .iter()
        .find(|s| s.name == "herald.append" && s.parent == publish.id)
        .expect("the engine append is the publish's child");
    assert_eq!(append.trace, TRACE_ID);

    // The proxy call: the subscribe's child, its traceparent sent.
    let subscribe = one("herald.subscribe");
    let proxy =
        spans.iter().find(|s| s.name == "herald.proxy" && s.parent == subscribe.id).expect("proxy span");
    assert_eq!(proxy.trace, subscribe.trace);
    let asked = collector.requests("/subscribe");
    let tp = asked[0].headers.get("traceparent").expect("traceparent sent to the proxy");
    assert_eq!(tp, &format!("00-{}-{}-01", proxy.trace, proxy.id));

    // The webhook request carries its span's traceparent.
    let hook = one("herald.webhook");
    let hooked =
        eventually("the webhook request", || async { collector.requests("/hook").into_iter().next() }).await;
    let tp = hooked.headers.get("traceparent").expect("traceparent sent to the webhook");
    assert!(tp.starts_with(&format!("00-{}-", hook.trace)), "{tp}");

    // Nothing secret in any attribute.
    for s in &spans {
        for (k, v) in &s.attributes {
            for secret in [API_KEY, SECRET, BODY_MARKER] {
                assert!(!v.contains(secret), "{}.{k} holds a secret or a body: {v}", s.name);
            }
        }
    }
    drop(stream);
}

#[tokio::test]
async fn a_sampler_that_samples_nothing_exports_nothing() {
    let collector = Collector::start().await;
    let herald = spawn(&collector, &[("OTEL_TRACES_SAMPLER", "always_off")]);
    for _ in 0..5 {
        assert_eq!(publish_traced(&herald, "chat:unsampled", "not-a-traceparent").await, 201);
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(collector.spans().is_empty(), "always_off: no span exported");
}
