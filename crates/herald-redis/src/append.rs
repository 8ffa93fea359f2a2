//! The append path (`Log::append`, `Log::append_batch`): the dedup keys
//! claimed for their channels, then script runs of whole channels
//! (`scripts/append.lua`, or `scripts/volatile.lua` for a run of volatile
//! messages without a key; several channels a run on a single instance,
//! one on a cluster), the runs in one pipeline. The hot path: each
//! message's arguments are written into its run's `EVALSHA` as they are
//! built, borrowing its frame template and id.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use herald_core::{AppendRequest, EngineError, Epoch, Receipt};
use herald_proto::ChannelName;
use redis::{Script, Value};

use crate::conn::Conn;
use crate::frame::FrameTemplate;
use crate::reply::{Appended, Reply};
use crate::scripts::{Append, AppendChannel, AppendMessage, VolatileRun, APPEND, VOLATILE};
use crate::state::{ms, new_epoch, new_id, EngineState};

/// Most messages in one `APPEND` run of several channels (single instance).
const RUN_MESSAGES: usize = 256;

impl EngineState {
    pub async fn append(&self, req: AppendRequest) -> Result<Receipt, EngineError> {
        let mut out = self.append_batch(vec![req]).await;
        out.pop().unwrap_or_else(|| Err(EngineError::Unavailable("redis append: no reply".into())))
    }

    /// Several appends as one submission, each answered as if appended
    /// alone, in the order given (see `Log::append_batch`): the dedup keys'
    /// claims in one round trip, then `APPEND` runs of whole channels, each
    /// channel's messages in batch order, all of them in one pipeline on
    /// one connection (a cluster: each channel's run on its own slot,
    /// concurrently). A channel's messages are in one script run, so a
    /// retry after `NOSCRIPT` cannot reorder them.
    pub async fn append_batch(&self, reqs: Vec<AppendRequest>) -> Vec<Result<Receipt, EngineError>> {
        if self.closing.load(Ordering::Acquire) {
            return reqs.iter().map(|_| Err(EngineError::ShuttingDown)).collect();
        }
        let mut out: Vec<Option<Result<Receipt, EngineError>>> = reqs.iter().map(|_| None).collect();
        if let Err(e) = self.claim_keys(&reqs, &mut out).await {
            self.counters.unavailable.bump();
            return reqs.iter().map(|_| Err(e.clone())).collect();
        }
        // The channels in order of first appearance, each with its
        // messages in batch order (the ones not refused by their claim).
        let mut groups: Vec<(ChannelName, Vec<usize>)> = Vec::new();
        let mut group_of: HashMap<&ChannelName, usize> = HashMap::new();
        for (i, req) in reqs.iter().enumerate() {
            if out[i].is_some() {
                continue;
            }
            let g = *group_of.entry(&req.channel).or_insert_with(|| {
                groups.push((req.channel.clone(), Vec::new()));
                groups.len() - 1
            });
            groups[g].1.push(i);
        }
        drop(group_of);
        let ids: Vec<String> = reqs.iter().map(|_| new_id()).collect();
        // The runs: each holds whole channels, so a retry after `NOSCRIPT`
        // cannot reorder a channel's messages.
        let runs = self.plan_runs(&groups);
        let cmds: Vec<(redis::Cmd, &'static Script)> =
            runs.iter().map(|run| self.append_command(&groups[run.clone()], &reqs, &ids)).collect();
        let replies = self.run_appends(cmds).await;
        for (run, reply) in runs.into_iter().zip(replies) {
            let members: Vec<usize> = groups[run].iter().flat_map(|(_, m)| m.iter().copied()).collect();
            let text = reply.and_then(|v| Reply::new("append", v)?.string("reply"));
            let lines = match &text {
                Ok(text) => {
                    let lines: Vec<&str> = text.split('\n').collect();
                    if lines.len() == members.len() {
                        Ok(lines)
                    } else {
                        Err(EngineError::Unavailable("redis append: malformed reply".into()))
                    }
                }
                Err(e) => Err(e.clone()),
            };
            match lines {
                Ok(lines) => {
                    for (&i, line) in members.iter().zip(lines) {
                        out[i] = Some(self.receipt_of(&reqs[i], &ids[i], line));
                    }
                }
                Err(e) => {
                    for &i in &members {
                        out[i] = Some(Err(e.clone()));
                    }
                }
            }
        }
        out.into_iter()
            .map(|r| {
                let r = r.unwrap_or_else(|| Err(EngineError::Unavailable("redis append: no reply".into())));
                if matches!(r, Err(EngineError::Unavailable(_))) {
                    self.counters.unavailable.bump();
                }
                r
            })
            .collect()
    }

    /// Claim the batch's dedup keys for their channels (`SET claim channel
    /// NX PX ttl GET`): a key first used on another channel is a mismatch,
    /// as in the embedded engine, and its request gets that answer in
    /// `out`. A key used twice in the batch is claimed once, by its first
    /// use; the later ones are judged against that claim, as they would be
    /// one after the other.
    async fn claim_keys(
        &self,
        reqs: &[AppendRequest],
        out: &mut [Option<Result<Receipt, EngineError>>],
    ) -> Result<(), EngineError> {
        let mut first_use: HashMap<&str, usize> = HashMap::new();
        let mut claims: Vec<usize> = Vec::new();
        for (i, req) in reqs.iter().enumerate() {
            if let Some(d) = &req.dedup {
                first_use.entry(&d.key).or_insert_with(|| {
                    claims.push(i);
                    i
                });
            }
        }
        if claims.is_empty() {
            return Ok(());
        }
        let cmds: Vec<redis::Cmd> = claims
            .iter()
            .map(|&i| {
                let (req, d) = (&reqs[i], reqs[i].dedup.as_ref().expect("claims have a key"));
                let mut c = redis::cmd("SET");
                c.arg(self.keys.claim(&d.key))
                    .arg(req.channel.as_str())
                    .arg("NX")
                    .arg("PX")
                    .arg(ms(d.ttl))
                    .arg("GET");
                c
            })
            .collect();
        let prev: Vec<Option<String>> = if self.redis.cluster {
            // Each key in its own slot: one call each, concurrently (the
            // keys are distinct, so their order does not matter).
            let calls = cmds.into_iter().map(|c| {
                self.redis
                    .call("claim", |mut conn| async move { c.query_async::<Option<String>>(&mut conn).await })
            });
            futures_util::future::join_all(calls).await.into_iter().collect::<Result<_, _>>()?
        } else {
            let mut pipe = redis::pipe();
            for c in cmds {
                pipe.add_command(c);
            }
            self.redis.call("claim", |mut conn| async move { pipe.query_async(&mut conn).await }).await?
        };
        let owner: HashMap<&str, &str> = claims
            .iter()
            .zip(&prev)
            .map(|(&i, p)| {
                let d = reqs[i].dedup.as_ref().expect("claims have a key");
                (&*d.key, p.as_deref().unwrap_or(reqs[i].channel.as_str()))
            })
            .collect();
        for (i, req) in reqs.iter().enumerate() {
            let Some(d) = &req.dedup else { continue };
            if owner.get(&*d.key).is_some_and(|o| *o != req.channel.as_str()) {
                self.counters.dedup_mismatches.bump();
                out[i] = Some(Err(EngineError::IdempotencyMismatch));
            }
        }
        Ok(())
    }

    /// The batch's channels (in order) cut into `APPEND` runs, as ranges
    /// of `groups`: on a cluster one channel per run (a script's keys share
    /// a slot); on a single instance consecutive channels together, up to
    /// [`RUN_MESSAGES`] messages a run (a channel with more is a run of its
    /// own), so one run does not hold Redis for long.
    fn plan_runs(&self, groups: &[(ChannelName, Vec<usize>)]) -> Vec<std::ops::Range<usize>> {
        if self.redis.cluster {
            return (0..groups.len()).map(|g| g..g + 1).collect();
        }
        let mut runs = Vec::new();
        let (mut start, mut messages) = (0, 0);
        for (g, (_, members)) in groups.iter().enumerate() {
            if g > start && messages + members.len() > RUN_MESSAGES {
                runs.push(start..g);
                (start, messages) = (g, 0);
            }
            messages += members.len();
        }
        if start < groups.len() {
            runs.push(start..groups.len());
        }
        runs
    }

    /// The run of some channels' messages (each with `members`, indexes
    /// into `reqs`, in batch order), as one `EVALSHA`, and its script:
    /// `VOLATILE` when every message is volatile without a key, else
    /// `APPEND`.
    fn append_command(
        &self,
        groups: &[(ChannelName, Vec<usize>)],
        reqs: &[AppendRequest],
        ids: &[String],
    ) -> (redis::Cmd, &'static Script) {
        let plain_volatile = |i: usize| !reqs[i].durable && reqs[i].dedup.is_none();
        if groups.iter().all(|(_, members)| members.iter().all(|&i| plain_volatile(i))) {
            let mut run = VolatileRun::begin(self.publish_cmd());
            for (ch, members) in groups {
                for &i in members {
                    let (req, id) = (&reqs[i], &ids[i]);
                    let tpl = FrameTemplate::new(req.kind, ch, false, id, &req.data, req.meta.as_ref());
                    run.message(&self.keys, ch, &tpl, id);
                }
            }
            return (run.command(), &VOLATILE);
        }
        let epoch = new_epoch();
        let mut run = Append { publish: self.publish_cmd(), epoch: &epoch }.begin();
        for (ch, members) in groups {
            run.channel(AppendChannel { keys: &self.keys, channel: ch });
            for &i in members {
                let (req, id) = (&reqs[i], &ids[i]);
                let tpl = FrameTemplate::new(req.kind, ch, req.durable, id, &req.data, req.meta.as_ref());
                run.message(
                    &self.keys,
                    ch,
                    AppendMessage {
                        durable: req.durable,
                        retention: &req.retention,
                        frame: &tpl,
                        id,
                        closes: req.durable && req.closes,
                        dedup: req.dedup.as_ref(),
                    },
                );
            }
        }
        (run.command(), &APPEND)
    }

    /// Run the append commands (each with its script), one reply (or
    /// error) each, in order.
    /// A single instance: one pipeline on one connection; a script Redis
    /// does not have cached (`NOSCRIPT`, after a restart or a failover) is
    /// loaded and that command run again (each is the whole of its
    /// channel's part of the batch, so nothing runs out of order).
    async fn run_appends(&self, cmds: Vec<(redis::Cmd, &'static Script)>) -> Vec<Result<Value, EngineError>> {
        if self.redis.cluster || cmds.len() <= 1 {
            let calls = cmds.iter().map(|(cmd, script)| {
                self.redis.call("append", move |mut c| async move { eval_append(cmd, script, &mut c).await })
            });
            return futures_util::future::join_all(calls).await;
        }
        let n = cmds.len();
        let mut pipe = redis::Pipeline::with_capacity(n);
        pipe.ignore_errors();
        let mut scripts = Vec::with_capacity(n);
        for (cmd, script) in cmds {
            pipe.add_command(cmd);
            scripts.push(script);
        }
        let pipe = &pipe;
        let replies: Result<Vec<Value>, EngineError> =
            self.redis.call("append", |mut c| async move { pipe.query_async(&mut c).await }).await;
        let replies = match replies {
            Ok(r) if r.len() == n => r,
            Ok(_) => {
                return (0..n)
                    .map(|_| Err(EngineError::Unavailable("redis append: malformed reply".into())))
                    .collect()
            }
            Err(e) => return (0..n).map(|_| Err(e.clone())).collect(),
        };
        let mut out = Vec::with_capacity(n);
        for ((cmd, script), reply) in pipe.cmd_iter().zip(scripts).zip(replies) {
            out.push(match reply {
                // Another error reply is read as one by `Reply::new`.
                Value::ServerError(e) if e.kind() == Some(redis::ServerErrorKind::NoScript) => {
                    self.redis
                        .call("append", |mut c| async move { eval_append(cmd, script, &mut c).await })
                        .await
                }
                v => Ok(v),
            });
        }
        out
    }

    /// One message's receipt from its line of the `APPEND` reply.
    fn receipt_of(&self, req: &AppendRequest, id: &str, line: &str) -> Result<Receipt, EngineError> {
        let ch = &req.channel;
        match AppendLine::parse(line)? {
            AppendLine::Ok(appended) => {
                let receipt = self.receipt(ch, id, appended);
                if req.durable {
                    self.counters.appends.bump();
                } else {
                    self.counters.volatile.bump();
                }
                Ok(receipt)
            }
            AppendLine::Dup { seq, id, ts, epoch } => {
                self.counters.dedup_hits.bump();
                Ok(Receipt { channel: ch.clone(), seq, id: Arc::from(id), epoch, ts, duplicate: true })
            }
            AppendLine::Mismatch => {
                self.counters.dedup_mismatches.bump();
                Err(EngineError::IdempotencyMismatch)
            }
            AppendLine::Closed => Err(self.refuse_closed()),
            AppendLine::Err(message) => Err(EngineError::Unavailable(format!("redis append: {message}"))),
        }
    }
}

/// Run an append command of `script`; a script Redis does not have cached
/// (`NOSCRIPT`) is loaded and the command run again.
async fn eval_append(cmd: &redis::Cmd, script: &Script, c: &mut Conn) -> redis::RedisResult<Value> {
    match cmd.query_async(c).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.load_async(c).await?;
            cmd.query_async(c).await
        }
        r => r,
    }
}

/// One message's line of the `APPEND` reply.
#[derive(Debug, PartialEq)]
enum AppendLine<'a> {
    /// `ok <seq|-> <ts> <epoch|-> <lost 0|1>`
    Ok(Appended),
    /// `dup <seq|-> <id> <ts> <epoch|->`: the receipt of an earlier append.
    Dup { seq: Option<u64>, id: &'a str, ts: u64, epoch: Epoch },
    /// `mismatch`: the key was used for other content.
    Mismatch,
    /// `closed`: the channel is closed.
    Closed,
    /// `err <message>`: this message was not appended.
    Err(&'a str),
}

impl<'a> AppendLine<'a> {
    fn parse(line: &'a str) -> Result<Self, EngineError> {
        let malformed = || EngineError::Unavailable("redis append: malformed reply".into());
        let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
        let seq = |s: &str| match s {
            "-" => Ok(None),
            s => s.parse().map(Some).map_err(|_| malformed()),
        };
        let epoch = |s: &str| Epoch::new(if s == "-" { "" } else { s });
        let int = |s: &str| s.parse::<u64>().map_err(|_| malformed());
        let mut f = rest.split(' ');
        Ok(match kind {
            "ok" => match (f.next(), f.next(), f.next(), f.next(), f.next()) {
                (Some(s), Some(ts), Some(e), Some(lost @ ("0" | "1")), None) => AppendLine::Ok(Appended {
                    seq: seq(s)?,
                    ts: int(ts)?,
                    epoch: epoch(e),
                    lost: lost == "1",
                }),
                _ => return Err(malformed()),
            },
            "dup" => match (f.next(), f.next(), f.next(), f.next(), f.next()) {
                (Some(s), Some(id), Some(ts), Some(e), None) => {
                    AppendLine::Dup { seq: seq(s)?, id, ts: int(ts)?, epoch: epoch(e) }
                }
                _ => return Err(malformed()),
            },
            "mismatch" if rest.is_empty() => AppendLine::Mismatch,
            "closed" if rest.is_empty() => AppendLine::Closed,
            "err" => AppendLine::Err(rest),
            _ => return Err(malformed()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of volatile messages without a key goes through `VOLATILE`;
    /// one with a keyed message through `APPEND`. On a fresh Redis a
    /// script is cached only once the engine has run it.
    #[tokio::test]
    async fn plain_volatile_runs_use_the_volatile_script() {
        use herald_core::{Dedup, Log};
        let redis = crate::testing::RedisServer::start();
        let engine = crate::testing::engine(&redis.url()).await;
        let client = redis::Client::open(redis.url()).unwrap();
        let mut con = client.get_multiplexed_async_connection().await.unwrap();
        let cached = async |con: &mut redis::aio::MultiplexedConnection| -> Vec<bool> {
            redis::cmd("SCRIPT")
                .arg("EXISTS")
                .arg(VOLATILE.get_hash())
                .arg(APPEND.get_hash())
                .query_async(con)
                .await
                .unwrap()
        };
        assert_eq!(cached(&mut con).await, [false, false]);
        let channel = ChannelName::new("live:a").unwrap();
        let message = |key: Option<&str>| AppendRequest {
            durable: false,
            dedup: key.map(|k| Dedup {
                key: k.into(),
                fingerprint: [7; 32],
                ttl: std::time::Duration::from_secs(60),
            }),
            ..herald_core::conformance::request(&channel, "1")
        };
        let out = engine.append_batch(vec![message(None), message(None)]).await;
        assert!(out.iter().all(|r| r.as_ref().is_ok_and(|r| r.seq.is_none())), "{out:?}");
        assert_eq!(cached(&mut con).await, [true, false]);
        let out = engine.append_batch(vec![message(None), message(Some("k1"))]).await;
        assert!(out.iter().all(|r| r.is_ok()), "{out:?}");
        assert_eq!(cached(&mut con).await, [true, true]);
    }

    #[test]
    fn append_lines_are_read_field_by_field() {
        let ok = AppendLine::parse("ok 5 17 E 1").unwrap();
        assert_eq!(ok, AppendLine::Ok(Appended { seq: Some(5), ts: 17, epoch: Epoch::new("E"), lost: true }));
        let volatile = AppendLine::parse("ok - 17 - 0").unwrap();
        assert_eq!(
            volatile,
            AppendLine::Ok(Appended { seq: None, ts: 17, epoch: Epoch::new(""), lost: false })
        );
        assert_eq!(
            AppendLine::parse("dup 3 id-1 9 E").unwrap(),
            AppendLine::Dup { seq: Some(3), id: "id-1", ts: 9, epoch: Epoch::new("E") }
        );
        assert_eq!(AppendLine::parse("mismatch").unwrap(), AppendLine::Mismatch);
        assert_eq!(AppendLine::parse("closed").unwrap(), AppendLine::Closed);
        assert_eq!(AppendLine::parse("err ERR a b c").unwrap(), AppendLine::Err("ERR a b c"));
        for bad in [
            "",
            "ok",
            "ok 5 17 E",
            "ok 5 17 E 2",
            "ok x 17 E 0",
            "ok 5 17 E 0 extra",
            "dup 3 id 9",
            "closed x",
            "what",
        ] {
            assert!(AppendLine::parse(bad).is_err(), "{bad:?}");
        }
    }
}
