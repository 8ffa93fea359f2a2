//! Fuzz harness of the replies' decoder (`fuzz/` target `resp_decode`):
//! the redis crate's codec, whose common types the vendored copy decodes
//! directly (vendor/README.md), gives for any bytes what its `combine`
//! grammar alone gives, whatever the reads' boundaries. The test below
//! replays the target's seeds and kept regression inputs.

use bytes::BytesMut;
use redis::{RedisResult, Value, ValueCodec};
use tokio_util::codec::Decoder;

/// `fuzz/` target `resp_decode`: the first byte sets the read size (1 to
/// 256 bytes), the rest is what Redis sent. Where `redis::parse_redis_value`
/// (the grammar alone) decodes a first value, the codec decodes the same,
/// fed the bytes whole or read by read. Where the grammar refuses the
/// bytes or cannot finish a value, the codec fed them whole decodes none
/// (fed in reads, upstream's `combine` can get past a type byte it
/// refuses, so only "no panic" holds there).
pub fn resp_decode(data: &[u8]) {
    let Some((&read, bytes)) = data.split_first() else { return };
    let grammar = redis::parse_redis_value(bytes);
    let whole = first_value(bytes, bytes.len().max(1));
    let in_reads = first_value(bytes, usize::from(read) + 1);
    // Debug text: a double may be NaN, which is not equal to itself.
    let text = |r: &RedisResult<Option<Value>>| match r {
        Ok(Some(v)) => format!("value {v:?}"),
        Ok(None) => "incomplete".to_owned(),
        Err(_) => "refused".to_owned(),
    };
    match &grammar {
        Ok(g) => {
            let g = format!("value {g:?}");
            assert_eq!(text(&whole), g, "read whole");
            assert_eq!(text(&in_reads), g, "read in reads of {}", usize::from(read) + 1);
        }
        Err(e) => {
            assert!(!matches!(whole, Ok(Some(_))), "the grammar refused ({e}), the codec: {}", text(&whole))
        }
    }
}

/// The first value the codec gives when fed `bytes` `read` at a time (or
/// none when they end inside it, or its refusal).
fn first_value(bytes: &[u8], read: usize) -> RedisResult<Option<Value>> {
    let mut codec = ValueCodec::default();
    let mut buf = BytesMut::new();
    for chunk in bytes.chunks(read) {
        buf.extend_from_slice(chunk);
        if let Some(v) = codec.decode(&mut buf)? {
            return Ok(Some(v));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    #[test]
    fn resp_decode_inputs_pass() {
        herald_proto::fuzzing::replay("resp_decode", super::resp_decode);
    }
}
