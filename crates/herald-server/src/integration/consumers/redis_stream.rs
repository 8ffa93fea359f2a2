//! The Redis Streams consumer: one stream, one owner at a time, read
//! through a consumer group.
//!
//! # Invariants
//!
//! - **One owner, the stream's order.** The stream is one partition owned
//!   through an [`Ownership`](herald_core::Ownership) lease; the owner
//!   reads it through the group under its own consumer name. Before new
//!   entries (`XREADGROUP >`) it takes over every pending entry of the
//!   group, a dead or paused node's included (`XAUTOCLAIM` from `0-0`
//!   with no idle minimum: the lease makes it the only reader), and
//!   publishes those first, in id order, so a channel's entries reach its
//!   log in stream order across a takeover.
//! - **Acknowledged only after the append is durable**, and only under the
//!   owner's fencing token: `XACK` runs in a script that first compares the
//!   token with the one the owner stored in `<stream>:herald-fence:<name>`
//!   when it took the stream. An unacknowledged entry is read again and
//!   its repeat is a receipt (the key is the entry's `idempotency_key`
//!   field or `row:<entry id>`).
//! - Entries that cannot be published are copied, with the error, to the
//!   stream `<stream>:dead` and acknowledged.
//!
//! The source is a single Redis instance (the fence key and the stream
//! are used in one script).

use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_proto::ErrorCode;
use redis::aio::MultiplexedConnection;
use redis::Value;

use super::{
    account, pause, publish_rows, Claim, Consumer, ConsumerConfig, Outcome, PartitionLease, Row,
    BACKOFF_START,
};
use crate::state::AppState;

/// Raise the fence to ARGV[1] unless a greater token is stored; the stored
/// token after.
const RAISE: &str = r"
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local mine = tonumber(ARGV[1])
if mine > cur then redis.call('SET', KEYS[1], ARGV[1]); return mine end
return cur";

/// Under the fence ARGV[1]: park entries (ARGV[3] = how many, then per
/// entry its id, code, error and fields as a count and pairs), then XACK
/// ARGV[2] (the group) and every id after. -1 when the fence moved.
const FINISH: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local i = 4
for _ = 1, tonumber(ARGV[3]) do
  local fields = {'id', ARGV[i], 'code', ARGV[i + 1], 'error', ARGV[i + 2]}
  local n = tonumber(ARGV[i + 3])
  for j = 1, n * 2 do fields[#fields + 1] = ARGV[i + 3 + j] end
  redis.call('XADD', KEYS[3], '*', unpack(fields))
  i = i + 4 + n * 2
end
local ids = {}
for j = i, #ARGV do ids[#ids + 1] = ARGV[j] end
if #ids == 0 then return 0 end
return redis.call('XACK', KEYS[2], ARGV[2], unpack(ids))";

#[derive(Debug, thiserror::Error)]
enum StreamError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("publish: {0}")]
    Publish(String),
    #[error("the stream was taken over by another owner")]
    Lost,
}

/// One entry: its id, fields in order.
type Entry = (String, Vec<(String, String)>);

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

/// `[id, [field, value, ...]]` items of a reply (nil items, entries
/// deleted meanwhile, are skipped).
fn entries(v: &Value) -> Vec<Entry> {
    let Value::Array(items) = v else { return Vec::new() };
    items
        .iter()
        .filter_map(|item| {
            let Value::Array(pair) = item else { return None };
            let id = text(pair.first()?)?;
            let fields = match pair.get(1)? {
                Value::Array(kv) => {
                    kv.chunks(2).filter_map(|c| Some((text(c.first()?)?, text(c.get(1)?)?))).collect()
                }
                Value::Map(kv) => kv.iter().filter_map(|(k, v)| Some((text(k)?, text(v)?))).collect(),
                _ => return None,
            };
            Some((id, fields))
        })
        .collect()
}

/// An entry as a row: its channels are `channel` and the JSON array of
/// strings `channels` (either may be absent, not both); `data` is required
/// (a missing one is parked as bad data). A `deliver_at` field is refused
/// (a stream entry is published when read): the entry is parked.
fn row((id, fields): &Entry) -> Row {
    let get = |k: &str| fields.iter().find(|(f, _)| f == k).map(|(_, v)| v.clone());
    let channels: Result<Option<Vec<Option<String>>>, _> = match get("channels") {
        None => Ok(None),
        Some(text) => serde_json::from_str::<Vec<String>>(&text)
            .map(|list| Some(list.into_iter().map(Some).collect()))
            .map_err(|_| "`channels` must be a JSON array of strings".to_owned()),
    };
    let (channels, bad) = match channels {
        Ok(c) => (c, None),
        Err(detail) => (None, Some((ErrorCode::BadChannel, detail))),
    };
    let mut row = Row::new(
        id.clone(),
        get("channel"),
        channels,
        get("data").unwrap_or_default(),
        get("meta"),
        get("idempotency_key"),
    );
    if let Some(bad) = bad {
        row.refused = Some(bad);
    } else if get("deliver_at").is_some() {
        row.refused = Some((
            ErrorCode::NotSupported,
            "`deliver_at` is not supported on a stream: an entry is published when it is read".to_owned(),
        ));
    }
    row
}

struct Source {
    con: MultiplexedConnection,
    /// This node's consumer name in the group.
    me: String,
    fence_key: String,
    dead_key: String,
}

async fn connect(cfg: &ConsumerConfig, me: &str) -> Result<Source, StreamError> {
    let client = redis::Client::open(cfg.url.as_str())?;
    // Replies wait at most the longest `BLOCK` (a poll interval) plus a
    // margin; the client's default (500 ms) would cut a longer block.
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(cfg.poll_interval + Duration::from_secs(2)));
    let mut con = client.get_multiplexed_async_connection_with_config(&config).await?;
    let created: Result<Value, redis::RedisError> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&cfg.stream)
        .arg(&cfg.group)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut con)
        .await;
    if let Err(e) = created {
        if e.code() != Some("BUSYGROUP") {
            return Err(e.into());
        }
    }
    Ok(Source {
        con,
        me: me.to_owned(),
        fence_key: format!("{}:herald-fence:{}", cfg.stream, cfg.name),
        dead_key: format!("{}:dead", cfg.stream),
    })
}

/// Pending entries of the group (any consumer's), now ours; else new ones,
/// waiting at most `block`.
async fn next_batch(
    src: &mut Source,
    cfg: &ConsumerConfig,
    block: Duration,
) -> Result<Vec<Entry>, StreamError> {
    let claimed: Value = redis::cmd("XAUTOCLAIM")
        .arg(&cfg.stream)
        .arg(&cfg.group)
        .arg(&src.me)
        .arg(0)
        .arg("0-0")
        .arg("COUNT")
        .arg(cfg.batch_size)
        .query_async(&mut src.con)
        .await?;
    if let Value::Array(parts) = &claimed {
        let pending = parts.get(1).map(entries).unwrap_or_default();
        if !pending.is_empty() {
            return Ok(pending);
        }
    }
    let read: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(&cfg.group)
        .arg(&src.me)
        .arg("COUNT")
        .arg(cfg.batch_size)
        .arg("BLOCK")
        .arg(block.as_millis().max(1) as u64)
        .arg("STREAMS")
        .arg(&cfg.stream)
        .arg(">")
        .query_async(&mut src.con)
        .await?;
    Ok(match &read {
        Value::Array(streams) => streams
            .iter()
            .flat_map(|s| match s {
                Value::Array(kv) => kv.get(1).map(entries).unwrap_or_default(),
                _ => Vec::new(),
            })
            .collect(),
        Value::Map(streams) => streams.iter().flat_map(|(_, v)| entries(v)).collect(),
        _ => Vec::new(),
    })
}

async fn raise_fence(src: &mut Source, token: u64) -> Result<(), StreamError> {
    let stored: u64 =
        redis::Script::new(RAISE).key(&src.fence_key).arg(token).invoke_async(&mut src.con).await?;
    if stored > token {
        return Err(StreamError::Lost);
    }
    Ok(())
}

/// Publish one batch, park and acknowledge under the fence.
async fn step(
    state: &AppState,
    consumer: &Consumer,
    src: &mut Source,
    token: u64,
    block: Duration,
) -> Result<bool, StreamError> {
    let cfg = &consumer.cfg;
    let batch = next_batch(src, cfg, block).await?;
    if batch.is_empty() {
        return Ok(false);
    }
    let rows: Vec<Row> = batch.iter().map(row).collect();
    let (outcomes, transient) = publish_rows(state, consumer, &rows).await;
    let finish = redis::Script::new(FINISH);
    let mut script = finish.prepare_invoke();
    script.key(&src.fence_key).key(&cfg.stream).key(&src.dead_key).arg(token).arg(&cfg.group);
    let parked: Vec<usize> =
        (0..batch.len()).filter(|&i| matches!(outcomes[i], Some(Outcome::Park { .. }))).collect();
    script.arg(parked.len());
    for &i in &parked {
        let Some(Outcome::Park { code, detail }) = &outcomes[i] else { continue };
        let (id, fields) = &batch[i];
        script.arg(id).arg(code.as_str()).arg(detail).arg(fields.len());
        for (k, v) in fields {
            script.arg(k).arg(v);
        }
    }
    let mut last = None;
    for (i, outcome) in outcomes.iter().enumerate() {
        if outcome.is_some() {
            script.arg(&batch[i].0);
            last = Some(batch[i].0.clone());
        }
    }
    let acked: i64 = script.invoke_async(&mut src.con).await?;
    if acked < 0 {
        return Err(StreamError::Lost);
    }
    account(state, consumer, 0, &rows, &outcomes);
    if let Some(last) = last {
        consumer.update(0, |s| s.last_id = Some(last));
    }
    if let Some(e) = transient {
        return Err(StreamError::Publish(e.detail));
    }
    Ok(batch.len() == cfg.batch_size)
}

/// Refresh `lag` (entries not yet delivered to the group plus pending
/// ones) and `parked_rows` (the dead-letter stream's length).
async fn observe(state: &AppState, consumer: &Consumer, src: &mut Source) -> Result<(), StreamError> {
    let cfg = &consumer.cfg;
    let groups: Value = redis::cmd("XINFO").arg("GROUPS").arg(&cfg.stream).query_async(&mut src.con).await?;
    let mut lag = None;
    if let Value::Array(groups) = groups {
        for g in groups {
            let fields: Vec<(String, Value)> = match g {
                Value::Array(kv) => {
                    kv.chunks(2).filter_map(|c| Some((text(c.first()?)?, c.get(1)?.clone()))).collect()
                }
                Value::Map(kv) => kv.into_iter().filter_map(|(k, v)| Some((text(&k)?, v))).collect(),
                _ => continue,
            };
            let get = |k: &str| fields.iter().find(|(f, _)| f == k).map(|(_, v)| v.clone());
            if get("name").as_ref().and_then(text).as_deref() != Some(cfg.group.as_str()) {
                continue;
            }
            let int = |v: Option<Value>| match v {
                Some(Value::Int(i)) => Some(i.max(0) as u64),
                _ => None,
            };
            lag = Some(int(get("lag")).unwrap_or(0) + int(get("pending")).unwrap_or(0));
        }
    }
    let parked: u64 = redis::cmd("XLEN").arg(&src.dead_key).query_async(&mut src.con).await?;
    consumer.update(0, |s| {
        s.lag = lag;
        s.parked_rows = Some(parked);
    });
    state
        .metrics
        .consumer_lag
        .get_or_create(&[("consumer", cfg.name.clone()), ("partition", "0".to_owned())])
        .set(lag.unwrap_or(0) as i64);
    Ok(())
}

/// The stream's loop until shutdown: own it, read, publish, acknowledge.
pub async fn run(state: Arc<AppState>, consumer: Arc<Consumer>) {
    let cfg = consumer.cfg.clone();
    let me = format!("herald-{}", state.consumers.holder);
    let mut source: Option<Source> = None;
    let mut lease = PartitionLease::new(&state, &cfg, 0);
    let mut backoff = BACKOFF_START;
    let mut observed = Instant::now() - cfg.poll_interval;
    let mut failing = false;
    while !state.shutdown.is_cancelled() {
        let held = match lease.claim(&state, &consumer).await {
            Claim::Held(held) => held,
            Claim::Busy => {
                tokio::select! {
                    () = state.shutdown.cancelled() => break,
                    () = tokio::time::sleep(cfg.poll_interval) => continue,
                }
            }
            Claim::Failed => {
                if !pause(&state, &mut backoff, lease.retry_cap(cfg.max_backoff)).await {
                    break;
                }
                continue;
            }
        };
        let token = held.token;
        if source.is_none() {
            match connect(&cfg, &me).await {
                Ok(s) => source = Some(s),
                Err(e) => {
                    fail(&state, &consumer, &e, &mut failing);
                    if !pause(&state, &mut backoff, cfg.max_backoff).await {
                        break;
                    }
                    continue;
                }
            }
        }
        let src = source.as_mut().expect("connected above");
        if !held.fenced {
            match raise_fence(src, token).await {
                Ok(()) => {
                    lease.fenced(&consumer);
                    tracing::info!(consumer = %cfg.name, token, "consumer stream owned");
                }
                Err(e) => {
                    if matches!(e, StreamError::Lost) {
                        lease.lost(&consumer);
                    }
                    fail(&state, &consumer, &e, &mut failing);
                    if !pause(&state, &mut backoff, cfg.max_backoff).await {
                        break;
                    }
                    continue;
                }
            }
        }
        // Block for new entries at most until the lease must be renewed.
        let block = match lease.renew_in() {
            Some(renew) => cfg.poll_interval.min(renew).max(Duration::from_millis(1)),
            None => cfg.poll_interval,
        };
        let stepped = tokio::select! {
            () = state.shutdown.cancelled() => break,
            r = step(&state, &consumer, src, token, block) => r,
        };
        match stepped {
            Ok(_) => {
                backoff = BACKOFF_START;
                if failing {
                    failing = false;
                    consumer.update(0, |s| s.last_error = None);
                    tracing::info!(consumer = %cfg.name, "consumer stream recovered");
                }
                if observed.elapsed() >= cfg.poll_interval {
                    observed = Instant::now();
                    if let Err(e) = observe(&state, &consumer, src).await {
                        fail(&state, &consumer, &e, &mut failing);
                    }
                }
            }
            Err(e) => {
                match e {
                    StreamError::Lost => lease.lost(&consumer),
                    // A connection error: dial again.
                    StreamError::Redis(_) => source = None,
                    StreamError::Publish(_) => {}
                }
                fail(&state, &consumer, &e, &mut failing);
                if !pause(&state, &mut backoff, cfg.max_backoff).await {
                    break;
                }
            }
        }
    }
    lease.release(&state, &consumer).await;
}

fn fail(state: &AppState, consumer: &Consumer, e: &StreamError, failing: &mut bool) {
    consumer.note_error(0, e);
    state.metrics.consumer_errors.get_or_create(&[("consumer", consumer.cfg.name.clone())]).inc();
    if !*failing {
        *failing = true;
        tracing::warn!(consumer = %consumer.cfg.name, error = %e, "consumer stream failing; retrying with backoff");
    }
}

/// Whether this build runs `redis-stream` consumers.
pub const BUILT: bool = true;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_read_from_both_reply_shapes_and_nil_items_skipped() {
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = Value::Array(vec![
            Value::Array(vec![b("1-0"), Value::Array(vec![b("channel"), b("orders:1"), b("data"), b("{}")])]),
            Value::Nil,
            Value::Array(vec![b("2-0"), Value::Map(vec![(b("channel"), b("orders:2"))])]),
        ]);
        let got = entries(&reply);
        assert_eq!(got.len(), 2);
        let r = row(&got[0]);
        assert_eq!(
            (r.id.as_str(), r.channels.as_slice(), r.data.as_str()),
            ("1-0", &["orders:1".to_owned()][..], "{}")
        );
        assert_eq!(row(&got[1]).data, "", "a missing `data` is parked as bad data");
    }

    #[test]
    fn an_entrys_channels_are_its_channel_then_its_channels_field_and_deliver_at_is_refused() {
        let entry = |fields: &[(&str, &str)]| -> Entry {
            ("1-0".to_owned(), fields.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
        };
        let r = row(&entry(&[("channel", "a:1"), ("channels", r#"["a:2","a:1","a:3"]"#), ("data", "1")]));
        assert_eq!(r.channels, ["a:1", "a:2", "a:3"]);
        assert!(r.refused.is_none());
        let r = row(&entry(&[("channels", r#"["a:2"]"#), ("data", "1")]));
        assert_eq!(r.channels, ["a:2"]);
        let r = row(&entry(&[("data", "1")]));
        assert_eq!(r.refused.map(|(c, _)| c), Some(ErrorCode::BadChannel), "no channel at all");
        let r = row(&entry(&[("channel", "a:1"), ("channels", "a:2"), ("data", "1")]));
        assert_eq!(r.refused.map(|(c, _)| c), Some(ErrorCode::BadChannel), "channels not a JSON array");
        let r = row(&entry(&[("channel", "a:1"), ("data", "1"), ("deliver_at", "1764000000000")]));
        assert_eq!(r.refused.map(|(c, _)| c), Some(ErrorCode::NotSupported));
    }
}
