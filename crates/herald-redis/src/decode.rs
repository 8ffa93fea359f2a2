//! Reading script replies. A reply that does not have the expected shape is
//! a bug or a foreign key in our namespace; it is reported as a redis
//! error (the call fails `Unavailable`), never guessed at.

use std::sync::Arc;

use bytes::Bytes;
use herald_core::{Epoch, Message, Seq};
use herald_proto::ChannelName;
use redis::{RedisError, RedisResult, Value};

pub(crate) fn bad(what: &str) -> RedisError {
    RedisError::from((redis::ErrorKind::UnexpectedReturnType, "unexpected reply", what.to_owned()))
}

pub(crate) fn array(v: Value, what: &str) -> RedisResult<Vec<Value>> {
    match v {
        Value::Array(a) | Value::Set(a) => Ok(a),
        _ => Err(bad(what)),
    }
}

pub(crate) fn bytes(v: Value, what: &str) -> RedisResult<Vec<u8>> {
    match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        Value::Okay => Ok(b"OK".to_vec()),
        Value::Int(i) => Ok(i.to_string().into_bytes()),
        _ => Err(bad(what)),
    }
}

pub(crate) fn string(v: Value, what: &str) -> RedisResult<String> {
    String::from_utf8(bytes(v, what)?).map_err(|_| bad(what))
}

pub(crate) fn u64_of(v: Value, what: &str) -> RedisResult<u64> {
    match v {
        Value::Int(i) => u64::try_from(i).map_err(|_| bad(what)),
        other => string(other, what)?.parse().map_err(|_| bad(what)),
    }
}

/// The seq of a stream id `<seq>-0`.
pub(crate) fn seq_of_id(id: &[u8]) -> Option<Seq> {
    let s = std::str::from_utf8(id).ok()?;
    let (seq, rest) = s.split_once('-')?;
    if rest != "0" {
        return None;
    }
    seq.parse().ok()
}

/// `"-"` stands for "none" in receipts and payloads.
pub(crate) fn opt(s: &str) -> Option<&str> {
    (s != "-").then_some(s)
}

/// One XRANGE entry: `[id, [t, ts, i, id, f, frame]]`. `closes_at`: the
/// seq of the channel's closing message, if it is closed.
pub(crate) fn message(
    v: Value,
    channel: &ChannelName,
    epoch: &Epoch,
    closes_at: Option<Seq>,
) -> RedisResult<Arc<Message>> {
    let mut e = array(v, "stream entry")?.into_iter();
    let (Some(id), Some(fields), None) = (e.next(), e.next(), e.next()) else {
        return Err(bad("stream entry"));
    };
    let seq = seq_of_id(&bytes(id, "entry id")?).ok_or_else(|| bad("entry id"))?;
    let mut fields = array(fields, "entry fields")?.into_iter();
    let (mut ts, mut mid, mut frame) = (None, None, None);
    while let (Some(k), Some(v)) = (fields.next(), fields.next()) {
        match bytes(k, "field name")?.as_slice() {
            b"t" => ts = Some(u64_of(v, "entry ts")?),
            b"i" => mid = Some(string(v, "entry id field")?),
            b"f" => frame = Some(bytes(v, "entry frame")?),
            _ => {}
        }
    }
    let (Some(ts), Some(id), Some(frame)) = (ts, mid, frame) else {
        return Err(bad("entry fields"));
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
