//! A frame (`message`, `room`, `join`, `leave`) as a template: the append
//! script knows the seq and the timestamp only when it runs, so the node
//! encodes the frame once with placeholders and the script joins
//! `head ++ seq ++ middle ++ ts ++ tail`. The result is byte for byte
//! `herald_proto::encode_frame` (a unit test checks it), so read and
//! fan-out hand out the embedded engine's frames.

use herald_proto::{encode_frame, ChannelName, FrameKind, Meta};
use memchr::memmem;
use serde_json::value::RawValue;

/// The frame encoded with `0` for its seq and ts, and where the three
/// constant parts around them lie in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FrameTemplate {
    frame: Vec<u8>,
    /// `head` is `frame[..head_end]`.
    head_end: usize,
    /// `middle` is `frame[middle.0..middle.1]` (empty without a seq).
    middle: (usize, usize),
    /// `tail` is `frame[tail_at..]`.
    tail_at: usize,
}

impl FrameTemplate {
    /// `durable`: the frame has a seq (volatile frames have none).
    pub fn new(
        kind: FrameKind,
        channel: &ChannelName,
        durable: bool,
        id: &str,
        data: &RawValue,
        meta: Option<&Meta>,
    ) -> Self {
        // serde_json writes fields in declaration order: type, channel, seq,
        // id, ts, then the body and meta. Channel names and ids never
        // contain `"`, so the first `,"seq":0,` and `,"ts":0,` are the
        // placeholders (the `0` just after each `:`).
        let frame = encode_frame(kind, channel, durable.then_some(0), id, 0, data, meta);
        let ts_at = memmem::find(&frame, b",\"ts\":0,").expect("frames have a ts") + b",\"ts\":".len();
        let (head_end, middle) = if durable {
            let seq_at = memmem::find(&frame[..ts_at], b",\"seq\":0,").expect("durable frames have a seq")
                + b",\"seq\":".len();
            (seq_at, (seq_at + 1, ts_at))
        } else {
            (ts_at, (ts_at, ts_at))
        };
        Self { frame, head_end, middle, tail_at: ts_at + 1 }
    }

    /// The frame up to its seq (durable) or its ts (volatile).
    pub fn head(&self) -> &[u8] {
        &self.frame[..self.head_end]
    }

    /// Between the seq and the ts (empty without a seq).
    pub fn middle(&self) -> &[u8] {
        &self.frame[self.middle.0..self.middle.1]
    }

    /// After the ts.
    pub fn tail(&self) -> &[u8] {
        &self.frame[self.tail_at..]
    }

    /// Whether the middle is what the scripts put there, so only the head
    /// and the tail go to Redis: none without a seq, else
    /// `,"id":"<id>","ts":` (the id, a UUID, needs no JSON escaping; see
    /// `frame_of` in helpers.lua).
    pub fn middle_is_built_from(&self, id: &str) -> bool {
        let m = self.middle();
        let (prefix, suffix) = (b",\"id\":\"", b"\",\"ts\":");
        m.is_empty()
            || (m.len() == prefix.len() + id.len() + suffix.len()
                && m.starts_with(prefix)
                && m.ends_with(suffix)
                && &m[prefix.len()..m.len() - suffix.len()] == id.as_bytes())
    }

    /// What the script produces (for tests and volatile fallbacks).
    #[cfg(test)]
    pub fn render(&self, seq: Option<u64>, ts: u64) -> Vec<u8> {
        let mut out = self.head().to_vec();
        if let Some(seq) = seq {
            out.extend_from_slice(seq.to_string().as_bytes());
        }
        out.extend_from_slice(self.middle());
        out.extend_from_slice(ts.to_string().as_bytes());
        out.extend_from_slice(self.tail());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendered_template_is_the_encoded_frame() {
        let ch = ChannelName::new("chat:x.y@z=1").unwrap();
        let id = "0190b2a1-7c3e-7000-8000-000000000001";
        let mut meta = Meta::new();
        meta.insert("trace".into(), "\"seq\":0,\"ts\":0,".into());
        let datas = [r#"{"seq":0,"ts":0}"#, r#"",\"ts\":0,""#, "0", r#"{"text":"hé","n":[1,2.5]}"#];
        for data in datas {
            let data = RawValue::from_string(data.to_owned()).unwrap();
            for meta in [None, Some(&meta)] {
                for (seq, ts) in [(1u64, 0u64), (0, 1), (42, 1_700_000_000_123), (u64::MAX, u64::MAX)] {
                    for kind in [FrameKind::Message, FrameKind::Room, FrameKind::Join, FrameKind::Leave] {
                        let t = FrameTemplate::new(kind, &ch, true, id, &data, meta);
                        assert!(
                            t.middle_is_built_from(id),
                            "{kind:?}: {:?}",
                            String::from_utf8_lossy(t.middle())
                        );
                        assert!(!t.middle_is_built_from("0190b2a1-7c3e-7000-8000-000000000002"));
                        assert_eq!(
                            t.render(Some(seq), ts),
                            encode_frame(kind, &ch, Some(seq), id, ts, &data, meta)
                        );
                        let v = FrameTemplate::new(kind, &ch, false, id, &data, meta);
                        assert!(v.middle().is_empty() && v.middle_is_built_from(id));
                        assert_eq!(v.render(None, ts), encode_frame(kind, &ch, None, id, ts, &data, meta));
                    }
                }
            }
        }
    }
}
