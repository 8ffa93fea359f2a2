//! Reading script replies: [`Reply`], one reply, and [`Fields`], an array
//! reply read front to back. Every script's reply is read through them, so
//! the errors are made here: a reply without the expected shape (a bug, or
//! a foreign key in our namespace) is `Unavailable("redis <call>:
//! malformed <field>")`, never guessed at, and a script's error reply
//! (`redis.error_reply`, its arguments refused) is `Unavailable("redis
//! <call>: <error>")` ([`failure`], also for every failed call, in
//! `conn.rs`).

use std::sync::Arc;

use bytes::Bytes;
use herald_core::{EngineError, Epoch, Message, Seq};
use herald_proto::ChannelName;
use redis::Value;

/// A failed command or script (an error reply, or no way to Redis), as
/// the engine reports it.
pub(crate) fn failure(what: &str, e: &redis::RedisError) -> EngineError {
    EngineError::Unavailable(format!("redis {what}: {e}"))
}

fn malformed(what: &str, field: &str) -> EngineError {
    EngineError::Unavailable(format!("redis {what}: malformed {field}"))
}

/// `"-"` stands for "none" in receipts, replies and payloads.
pub(crate) fn opt(s: &str) -> Option<&str> {
    (s != "-").then_some(s)
}

/// The seq of a stream id `<seq>-0`.
fn seq_of_id(id: &[u8]) -> Option<Seq> {
    let s = std::str::from_utf8(id).ok()?;
    let (seq, rest) = s.split_once('-')?;
    if rest != "0" {
        return None;
    }
    seq.parse().ok()
}

/// One reply of the call `what` (the name its errors carry).
pub(crate) struct Reply {
    what: &'static str,
    value: Value,
}

impl Reply {
    /// A script's error reply (in a pipeline, where errors are values) is
    /// [`failure`].
    pub fn new(what: &'static str, value: Value) -> Result<Self, EngineError> {
        if let Value::ServerError(e) = value {
            let e = redis::RedisError::from(e);
            tracing::warn!(error = %e, what, "redis refused a command");
            return Err(failure(what, &e));
        }
        Ok(Self { what, value })
    }

    /// A bulk or simple string (or an integer, as its digits).
    pub fn bytes(self, field: &str) -> Result<Vec<u8>, EngineError> {
        match self.value {
            Value::BulkString(b) => Ok(b),
            Value::SimpleString(s) => Ok(s.into_bytes()),
            Value::Okay => Ok(b"OK".to_vec()),
            Value::Int(i) => Ok(i.to_string().into_bytes()),
            _ => Err(malformed(self.what, field)),
        }
    }

    pub fn string(self, field: &str) -> Result<String, EngineError> {
        let what = self.what;
        String::from_utf8(self.bytes(field)?).map_err(|_| malformed(what, field))
    }

    /// A string, or nothing (a nil reply).
    pub fn bulk(self, field: &str) -> Result<Option<String>, EngineError> {
        match self.value {
            Value::Nil => Ok(None),
            _ => self.string(field).map(Some),
        }
    }

    /// An integer, or a string of one.
    pub fn signed(self, field: &str) -> Result<i64, EngineError> {
        match self.value {
            Value::Int(i) => Ok(i),
            _ => {
                let what = self.what;
                self.string(field)?.parse().map_err(|_| malformed(what, field))
            }
        }
    }

    /// A non-negative integer, or a string of one.
    pub fn int(self, field: &str) -> Result<u64, EngineError> {
        let what = self.what;
        u64::try_from(self.signed(field)?).map_err(|_| malformed(what, field))
    }

    /// An array, to read front to back.
    pub fn fields(self, field: &str) -> Result<Fields, EngineError> {
        match self.value {
            Value::Array(a) | Value::Set(a) => Ok(Fields { what: self.what, items: a.into_iter() }),
            _ => Err(malformed(self.what, field)),
        }
    }

    /// One XRANGE entry: `[id, [t, ts, i, id, f, frame]]`. `closes_at`: the
    /// seq of the channel's closing message, if it is closed.
    pub fn message(
        self,
        channel: &ChannelName,
        epoch: &Epoch,
        closes_at: Option<Seq>,
    ) -> Result<Arc<Message>, EngineError> {
        let what = self.what;
        let mut e = self.fields("stream entry")?;
        let seq = seq_of_id(&e.next_reply("entry id")?.bytes("entry id")?)
            .ok_or_else(|| malformed(what, "entry id"))?;
        let mut fields = e.fields("entry fields")?;
        if !e.is_empty() {
            return Err(malformed(what, "stream entry"));
        }
        let (mut ts, mut mid, mut frame) = (None, None, None);
        while let (Some(k), Some(v)) = (fields.next(), fields.next()) {
            match k.bytes("field name")?.as_slice() {
                b"t" => ts = Some(v.int("entry ts")?),
                b"i" => mid = Some(v.string("entry id field")?),
                b"f" => frame = Some(v.bytes("entry frame")?),
                _ => {}
            }
        }
        let (Some(ts), Some(id), Some(frame)) = (ts, mid, frame) else {
            return Err(malformed(what, "entry fields"));
        };
        Ok(Arc::new(Message {
            channel: channel.clone(),
            seq: Some(seq),
            id: Arc::from(id),
            ts,
            epoch: epoch.clone(),
            frame: Bytes::from(frame),
            closes: closes_at == Some(seq),
        }))
    }
}

/// What a script that appended one message says of it (`APPEND`,
/// `ROOM_WRITE`, `SCHED_DELIVER`): `seq|'-', ts, epoch|'-', lost`.
#[derive(Debug, PartialEq)]
pub(crate) struct Appended {
    /// None for a volatile message.
    pub seq: Option<Seq>,
    pub ts: u64,
    pub epoch: Epoch,
    /// The script found the channel's meta lost (and started a new epoch).
    pub lost: bool,
}

/// An array reply, read front to back; each item is a [`Reply`].
pub(crate) struct Fields {
    what: &'static str,
    items: std::vec::IntoIter<Value>,
}

impl Iterator for Fields {
    type Item = Reply;

    fn next(&mut self) -> Option<Reply> {
        self.items.next().map(|value| Reply { what: self.what, value })
    }
}

impl Fields {
    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.len() == 0
    }

    /// The next item; missing is malformed.
    pub fn next_reply(&mut self, field: &str) -> Result<Reply, EngineError> {
        self.next().ok_or_else(|| malformed(self.what, field))
    }

    /// A reply's kind: its first item, a string (`'ok'`, `'closed'`, ...).
    pub fn status(&mut self) -> Result<String, EngineError> {
        self.string("reply kind")
    }

    /// A status this call does not know.
    pub fn unexpected(&self) -> EngineError {
        malformed(self.what, "reply kind")
    }

    pub fn string(&mut self, field: &str) -> Result<String, EngineError> {
        self.next_reply(field)?.string(field)
    }

    pub fn int(&mut self, field: &str) -> Result<u64, EngineError> {
        self.next_reply(field)?.int(field)
    }

    /// `1` (true) or anything else (false).
    pub fn flag(&mut self, field: &str) -> Result<bool, EngineError> {
        Ok(self.int(field)? == 1)
    }

    pub fn fields(&mut self, field: &str) -> Result<Fields, EngineError> {
        self.next_reply(field)?.fields(field)
    }

    /// A seq, or `'-'` for none.
    pub fn seq(&mut self, field: &str) -> Result<Option<Seq>, EngineError> {
        let s = self.string(field)?;
        opt(&s).map(|s| s.parse().map_err(|_| malformed(self.what, field))).transpose()
    }

    /// An epoch, `'-'` for none (the empty epoch).
    pub fn epoch(&mut self, field: &str) -> Result<Epoch, EngineError> {
        let s = self.string(field)?;
        Ok(Epoch::new(opt(&s).unwrap_or("")))
    }

    /// `seq|'-', ts, epoch|'-', lost`: see [`Appended`].
    pub fn appended(&mut self) -> Result<Appended, EngineError> {
        Ok(Appended {
            seq: self.seq("seq")?,
            ts: self.int("ts")?,
            epoch: self.epoch("epoch")?,
            lost: self.flag("lost")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn an_appended_reply_reads_dashes_as_none() {
        let v = Value::Array(vec![bulk("ok"), bulk("-"), bulk("17"), bulk("-"), Value::Int(0)]);
        let mut r = Reply::new("append", v).unwrap().fields("reply").unwrap();
        assert_eq!(r.status().unwrap(), "ok");
        let a = r.appended().unwrap();
        assert_eq!((a.seq, a.ts, a.epoch.as_str(), a.lost), (None, 17, "", false));
        let v = Value::Array(vec![bulk("5"), Value::Int(17), bulk("E"), Value::Int(1)]);
        let a = Reply::new("append", v).unwrap().fields("reply").unwrap().appended().unwrap();
        assert_eq!((a.seq, a.ts, a.epoch.as_str(), a.lost), (Some(5), 17, "E", true));
    }

    #[test]
    fn a_reply_of_another_shape_is_unavailable_naming_the_field() {
        let mut r =
            Reply::new("room write", Value::Array(vec![bulk("ok")])).unwrap().fields("reply").unwrap();
        r.status().unwrap();
        assert_eq!(r.seq("seq"), Err(EngineError::Unavailable("redis room write: malformed seq".into())));
        let e = Reply::new("presence count", bulk("x")).unwrap().int("count").unwrap_err();
        assert_eq!(e, EngineError::Unavailable("redis presence count: malformed count".into()));
        assert!(Reply::new("read", Value::Int(1)).unwrap().fields("reply").is_err());
    }

    #[test]
    fn an_error_reply_is_unavailable() {
        let v = Value::ServerError(
            redis::ServerError::try_from(redis::make_extension_error(
                "ERR".to_owned(),
                Some("herald append: bad arguments".to_owned()),
            ))
            .unwrap(),
        );
        assert!(
            matches!(Reply::new("append", v), Err(EngineError::Unavailable(m)) if m.starts_with("redis append: "))
        );
    }
}
