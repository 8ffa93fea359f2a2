//! `herald publish`, `herald publish-batch` and `herald tail`: the API and
//! a resilient subscriber from a terminal, built on `herald-client`.

use std::io::Write;

use anyhow::{bail, Context};
use herald_client::{Auth, Client, ClientOptions, ConnectOptions, Event, HttpApi, Meta};

const DEFAULT_URL: &str = "http://127.0.0.1:8700";

#[derive(Debug, clap::Args)]
pub struct PublishArgs {
    /// Channel, e.g. chat:demo
    pub channel: String,
    /// Message data: any JSON value, e.g. '{"text":"hi"}' or '"plain string"'
    pub json: String,
    /// Server address
    #[arg(long, env = "HERALD_URL", default_value = DEFAULT_URL)]
    pub url: String,
    /// API key (not needed against a --dev server)
    #[arg(long, env = "HERALD_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Idempotency-Key: retrying with the same key publishes once
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Metadata entry KEY=VALUE (repeatable)
    #[arg(long = "meta", value_name = "KEY=VALUE")]
    pub meta: Vec<String>,
    /// Scheduled delivery at a time: RFC 3339 (2030-01-01T09:00:00Z) or ms
    /// since the Unix epoch
    #[arg(long, value_name = "TIME", conflicts_with = "in_")]
    pub at: Option<String>,
    /// Scheduled delivery after a delay, e.g. 90s, 10m, 2h
    #[arg(long = "in", id = "in_", value_name = "DURATION")]
    pub in_: Option<String>,
}

/// `--at`: ms since the Unix epoch, or an RFC 3339 time.
fn parse_at(s: &str) -> anyhow::Result<u64> {
    if let Ok(ms) = s.parse::<u64>() {
        return Ok(ms);
    }
    let t = humantime::parse_rfc3339_weak(s)
        .with_context(|| format!("--at takes ms since the Unix epoch or an RFC 3339 time, got `{s}`"))?;
    let d = t.duration_since(std::time::UNIX_EPOCH).context("--at is before 1970")?;
    Ok(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[derive(Debug, clap::Args)]
pub struct TailArgs {
    /// Channel, e.g. chat:demo
    pub channel: String,
    /// Resume after this seq (prints the missed messages first)
    #[arg(long)]
    pub since: Option<u64>,
    /// Epoch of `--since` (from an earlier `ok`); a mismatch is reported
    #[arg(long, requires = "since")]
    pub epoch: Option<String>,
    /// Server address
    #[arg(long, env = "HERALD_URL", default_value = DEFAULT_URL)]
    pub url: String,
    /// Client JWT
    #[arg(long, env = "HERALD_TOKEN", hide_env_values = true, conflicts_with = "user")]
    pub token: Option<String>,
    /// Dev mode user (servers started with --dev)
    #[arg(long)]
    pub user: Option<String>,
    /// Device id
    #[arg(long)]
    pub device: Option<String>,
    /// Exit after this many messages
    #[arg(long)]
    pub count: Option<u64>,
}

pub async fn publish(args: PublishArgs) -> anyhow::Result<()> {
    // Sent as written (key order, number spelling): the server stores
    // `data` byte for byte.
    let data: Box<serde_json::value::RawValue> = serde_json::from_str(&args.json)
        .with_context(|| format!("the message is not valid JSON (quote strings: '\"{}\"')", args.json))?;
    let mut meta = Meta::new();
    for entry in &args.meta {
        let Some((k, v)) = entry.split_once('=') else { bail!("--meta takes KEY=VALUE, got `{entry}`") };
        meta.insert(k.to_owned(), v.to_owned());
    }
    let api = match &args.api_key {
        Some(key) => HttpApi::new(&args.url, key.clone()),
        None => HttpApi::anonymous(&args.url),
    };
    let meta = (!meta.is_empty()).then_some(meta);
    let when = match (&args.at, &args.in_) {
        (Some(at), _) => Some(herald_client::DeliverAt::At(parse_at(at)?)),
        (None, Some(d)) => Some(herald_client::DeliverAt::In(
            humantime::parse_duration(d)
                .with_context(|| format!("--in takes a duration like 90s, got `{d}`"))?,
        )),
        (None, None) => None,
    };
    if let Some(when) = when {
        let r = api
            .publish_scheduled(&args.channel, &*data, meta.as_ref(), when, args.idempotency_key.as_deref())
            .await?;
        let out = serde_json::json!({
            "scheduled_id": r.scheduled_id,
            "channel": r.channel,
            "deliver_at": r.deliver_at,
        });
        print_receipt(out, r.replayed);
        return Ok(());
    }
    let result = api.publish(&args.channel, &*data, meta.as_ref(), args.idempotency_key.as_deref()).await?;
    let out = serde_json::json!({
        "channel": result.channel,
        "seq": result.seq,
        "id": result.id,
        "epoch": result.epoch,
    });
    print_receipt(out, result.replayed);
    Ok(())
}

/// Print a publish receipt as one JSON line; `"replayed": true` only on
/// an answer from an idempotency receipt.
fn print_receipt(mut out: serde_json::Value, replayed: bool) {
    if replayed {
        out["replayed"] = true.into();
    }
    println!("{out}");
}

/// One line of `herald tail`.
#[derive(serde::Serialize)]
struct TailLine<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    channel: &'a str,
    seq: Option<u64>,
    id: &'a str,
    ts: u64,
    data: &'a serde_json::value::RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    meta: Option<&'a herald_proto::Meta>,
}

pub async fn tail(args: TailArgs) -> anyhow::Result<()> {
    let auth = match (&args.token, &args.user) {
        (Some(t), _) => Auth::Token(t.clone()),
        (None, Some(u)) => Auth::DevUser(u.clone()),
        (None, None) => bail!("give --token (or HERALD_TOKEN), or --user NAME against a --dev server"),
    };
    let mut connect = ConnectOptions::new(&args.url, auth);
    connect.device = args.device.clone();
    let client = Client::new(ClientOptions::new(connect));
    let since = args.since.map(|s| (s, args.epoch.clone().unwrap_or_default()));
    let mut sub = client.subscribe(&args.channel, since).await?;
    let info = sub.info().clone();
    eprintln!(
        "subscribed to {} (epoch {}, first {}, head {}){}",
        info.channel,
        info.epoch.as_deref().unwrap_or("-"),
        info.first.map_or("-".into(), |v| v.to_string()),
        info.head.map_or("-".into(), |v| v.to_string()),
        if info.truncated { "; TRUNCATED: older messages were removed by retention" } else { "" },
    );
    let mut printed = 0u64;
    let stdout = std::io::stdout();
    loop {
        let event = tokio::select! {
            e = sub.next() => e,
            _ = tokio::signal::ctrl_c() => break,
        };
        match event {
            None => bail!("subscription ended"),
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(Event::Message(m))) => {
                // `data` printed as received, never through a JSON value
                // (which would reorder keys, round big numbers and refuse
                // what it cannot hold, like 1e400).
                let line = serde_json::to_string(&TailLine {
                    kind: m.kind.as_str(),
                    channel: m.channel.as_str(),
                    seq: m.seq,
                    id: &m.id,
                    ts: m.ts,
                    data: &m.data,
                    meta: m.meta.as_ref(),
                })?;
                let mut lock = stdout.lock();
                writeln!(lock, "{line}")?;
                lock.flush()?;
                printed += 1;
                if args.count.is_some_and(|c| printed >= c) {
                    break;
                }
            }
            Some(Ok(Event::Reset { truncated, epoch_changed, first, .. })) => {
                eprintln!(
                    "reset: truncated={truncated} epoch_changed={epoch_changed}; continuing from seq {first}"
                );
            }
            Some(Ok(Event::Gap { expected, got, .. })) => {
                eprintln!("GAP: seqs {expected}..{got} missing");
            }
            Some(Ok(Event::Unsubscribed { reason, .. })) => {
                eprintln!("unsubscribed by the server: {reason}");
                break;
            }
        }
    }
    client.close().await;
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct PublishBatchArgs {
    /// JSON lines, one message a line ({"channel" or "channels", "data",
    /// "meta"?, "idempotency_key"?, "deliver_at"?|"delay_ms"?}); `-` reads
    /// stdin
    pub file: String,
    /// Messages per request (at most the server's publish.max_batch_messages)
    #[arg(long, default_value_t = 500)]
    pub per_request: usize,
    /// Server address
    #[arg(long, env = "HERALD_URL", default_value = DEFAULT_URL)]
    pub url: String,
    /// API key (not needed against a --dev server)
    #[arg(long, env = "HERALD_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

/// `herald publish-batch`: every line through `POST /api/v1/messages`,
/// `--per-request` at a time, one result line printed per message in input
/// order. Fails (after printing every result) when any message failed;
/// running it again with the same input is safe for the lines that carry
/// an `idempotency_key`.
pub async fn publish_batch(args: PublishBatchArgs) -> anyhow::Result<()> {
    use std::io::BufRead;
    if args.per_request == 0 {
        bail!("--per-request must be at least 1");
    }
    let reader: Box<dyn BufRead> = if args.file == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::io::BufReader::new(
            std::fs::File::open(&args.file).with_context(|| format!("cannot open `{}`", args.file))?,
        ))
    };
    let mut messages = Vec::new();
    for (n, line) in reader.lines().enumerate() {
        let line = line.with_context(|| format!("cannot read `{}`", args.file))?;
        if line.trim().is_empty() {
            continue;
        }
        let m: herald_client::MessageItem =
            serde_json::from_str(&line).with_context(|| format!("line {}: not a message", n + 1))?;
        messages.push(m);
    }
    let api = match &args.api_key {
        Some(key) => HttpApi::new(&args.url, key.clone()),
        None => HttpApi::anonymous(&args.url),
    };
    let mut failed = 0usize;
    let total = messages.len();
    let mut rest = messages.into_iter().peekable();
    let stdout = std::io::stdout();
    while rest.peek().is_some() {
        let chunk: Vec<_> = rest.by_ref().take(args.per_request).collect();
        for result in api.publish_messages(chunk).await? {
            failed += usize::from(result.is_error());
            writeln!(stdout.lock(), "{}", serde_json::to_string(&result)?)?;
        }
    }
    if failed > 0 {
        bail!("{failed} of {total} messages failed (see their `error`)");
    }
    Ok(())
}
