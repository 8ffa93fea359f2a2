//! The vendored redis crate decodes the common RESP types straight from
//! the buffer (vendor/README.md) and leaves the rest to its `combine`
//! grammar. Every connection of this engine reads through that codec, so
//! it must give exactly what the grammar gives: the same values, whatever
//! the reads' boundaries, and the same refusal of malformed input.

use bytes::BytesMut;
use redis::{PushKind, Value, ValueCodec};
use tokio_util::codec::Decoder;

/// A small deterministic generator (xorshift64*), so a failure repeats.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn bytes(&mut self, max: u64) -> Vec<u8> {
        let len = self.below(max + 1);
        // CR and LF inside bulk data are data.
        (0..len).map(|_| b"ab\r\n\x00\xffz"[self.below(7) as usize]).collect()
    }
    fn text(&mut self, max: u64) -> String {
        let len = self.below(max + 1);
        (0..len).map(|_| ['a', 'Z', ' ', '9', 'é'][self.below(5) as usize]).collect()
    }
}

/// A random value and its RESP encoding; the types the fast path decodes
/// and, inside them, some it leaves to the grammar (maps, doubles,
/// booleans, errors).
fn gen(rng: &mut Rng, depth: u32, out: &mut Vec<u8>) -> Value {
    let pick = if depth >= 3 { rng.below(5) } else { rng.below(10) };
    match pick {
        0 => {
            let s = if rng.below(4) == 0 { "OK".to_owned() } else { rng.text(12) };
            out.extend_from_slice(format!("+{s}\r\n").as_bytes());
            if s == "OK" {
                Value::Okay
            } else {
                Value::SimpleString(s)
            }
        }
        1 => {
            let n = rng.next() as i64;
            out.extend_from_slice(format!(":{n}\r\n").as_bytes());
            Value::Int(n)
        }
        2 | 3 => {
            let b = rng.bytes(40);
            out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
            out.extend_from_slice(&b);
            out.extend_from_slice(b"\r\n");
            Value::BulkString(b)
        }
        4 => {
            if rng.below(2) == 0 {
                out.extend_from_slice(b"$-1\r\n");
            } else {
                out.extend_from_slice(b"_\r\n");
            }
            Value::Nil
        }
        5 | 6 => {
            let n = rng.below(5);
            out.extend_from_slice(format!("*{n}\r\n").as_bytes());
            Value::Array((0..n).map(|_| gen(rng, depth + 1, out)).collect())
        }
        7 => {
            let kinds = [
                ("message", PushKind::Message),
                ("smessage", PushKind::SMessage),
                ("subscribe", PushKind::Subscribe),
            ];
            let (name, kind) = kinds[rng.below(3) as usize].clone();
            let n = rng.below(3);
            out.extend_from_slice(format!(">{}\r\n${}\r\n{name}\r\n", n + 1, name.len()).as_bytes());
            Value::Push { kind, data: (0..n).map(|_| gen(rng, depth + 1, out)).collect() }
        }
        8 => {
            out.extend_from_slice(b"%1\r\n+k\r\n:1\r\n");
            Value::Map(vec![(Value::SimpleString("k".into()), Value::Int(1))])
        }
        _ => {
            out.extend_from_slice(b"#t\r\n");
            Value::Boolean(true)
        }
    }
}

/// Decode `bytes` fed in the given chunk sizes; every value and what is
/// left undecoded.
fn decode_in_chunks(bytes: &[u8], chunks: &mut dyn FnMut() -> usize) -> Vec<Value> {
    let mut codec = ValueCodec::default();
    let mut buf = BytesMut::new();
    let mut values = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let n = chunks().clamp(1, bytes.len() - at);
        buf.extend_from_slice(&bytes[at..at + n]);
        at += n;
        while let Some(v) = codec.decode(&mut buf).expect("well-formed input decodes") {
            values.push(v);
        }
    }
    assert!(buf.is_empty(), "{} bytes left undecoded", buf.len());
    values
}

#[test]
fn values_decode_the_same_whatever_the_reads() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for round in 0..400 {
        let mut bytes = Vec::new();
        let expected: Vec<Value> = (0..1 + rng.below(6)).map(|_| gen(&mut rng, 0, &mut bytes)).collect();
        // The grammar alone (`parse_redis_value` does not take the fast
        // path) agrees on the first value.
        assert_eq!(redis::parse_redis_value(&bytes).unwrap(), expected[0], "round {round}");
        assert_eq!(decode_in_chunks(&bytes, &mut || bytes.len()), expected, "round {round}, one read");
        assert_eq!(decode_in_chunks(&bytes, &mut || 1), expected, "round {round}, byte by byte");
        let mut split = Rng(round + 1);
        assert_eq!(
            decode_in_chunks(&bytes, &mut || 1 + split.below(17) as usize),
            expected,
            "round {round}, random reads"
        );
    }
}

#[test]
fn a_pubsub_message_push_decodes_to_its_kind_channel_and_payload() {
    let mut buf = BytesMut::from(&b">3\r\n$7\r\nmessage\r\n$9\r\nherald:fn\r\n$5\r\nv2 x\n\r\n"[..]);
    let v = ValueCodec::default().decode(&mut buf).unwrap().unwrap();
    assert_eq!(
        v,
        Value::Push {
            kind: PushKind::Message,
            data: vec![Value::BulkString(b"herald:fn".to_vec()), Value::BulkString(b"v2 x\n".to_vec())],
        }
    );
    assert!(buf.is_empty());
}

#[test]
fn malformed_input_is_refused_as_the_grammar_refuses_it() {
    for bad in [
        &b"$3\r\nabcd\r\n"[..], // data longer than its length
        b":12x\r\n",            // not an integer
        b">1\r\n:5\r\n",        // a push whose kind is not a string
        b"+\xff\xfe\r\n",       // not UTF-8
        b"?\r\n",               // no such type
    ] {
        let grammar = redis::parse_redis_value(bad);
        let codec = ValueCodec::default().decode(&mut BytesMut::from(bad));
        assert!(grammar.is_err(), "{:?}: {grammar:?}", String::from_utf8_lossy(bad));
        assert!(codec.is_err(), "{:?}: {codec:?}", String::from_utf8_lossy(bad));
    }
}
