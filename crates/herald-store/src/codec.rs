//! Binary encodings of the store's keys and values.
//!
//! Fixed-width integers are big-endian so keys sort numerically. Every value
//! starts with a format byte so the layout can evolve; an unknown format is
//! reported as corruption, never guessed at.

use std::time::Duration;

use uuid::Uuid;

/// Separates the channel from the seq in a log key. Channel names never
/// contain `\0` (see `ChannelName`), and `\0` sorts before every byte a
/// name may contain, so the keys of one channel form one contiguous range
/// that no other channel's keys interleave with.
const LOG_KEY_SEP: u8 = 0;

const FORMAT_V1: u8 = 1;
/// Second layout of a value whose first layout is [`FORMAT_V1`] (only
/// [`ChannelMeta`] has one).
const FORMAT_V2: u8 = 2;

/// Bytes before the frame in a log value: format, ts, id.
pub(crate) const LOG_HEADER_LEN: usize = 1 + 8 + 16;

/// A value that does not decode: the store is corrupt or from a newer
/// version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("undecodable {what}")]
pub(crate) struct CodecError {
    pub what: &'static str,
}

fn bad(what: &'static str) -> CodecError {
    CodecError { what }
}

/// A message id as clients see it (hyphenated, lower case), written
/// straight into the shared string (no intermediate `String`).
pub(crate) fn id_str(id: &Uuid) -> std::sync::Arc<str> {
    std::sync::Arc::from(&*id.hyphenated().encode_lower(&mut Uuid::encode_buffer()))
}

/// How a data dir lays out the keys of its two per-append keyspaces (`log`
/// and `channels`), fixed by its store format (`storage.rs`). Either way
/// the log keys of one channel form one contiguous range in seq order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyLayout {
    /// Format 1: log `channel ++ 0x00 ++ seq (u64 BE)`, channel meta
    /// `channel`.
    Plain,
    /// Format 2: the same after `tag(channel)`, the tag being
    /// [`channel_tag`]. The storage engine's memtable compares keys by their
    /// first four bytes before anything else; with the channel name first
    /// those would be the namespace (`chat`) for every key, so every
    /// comparison of an insert would read and compare the whole key. With
    /// the tag they tell two channels apart nearly always.
    Tagged,
}

impl KeyLayout {
    /// Whether a channel's stored meta may lag its log (format 2): an
    /// append writes the meta only when `first`, `max_age` or `closed`
    /// change, so the stored `head` is a lower bound and the log's last
    /// entry of the channel, when later, is the head (`Storage::channel_meta`).
    /// Format 1 writes the meta with every batch that appends (binaries that
    /// read only format 1 trust its `head`).
    pub(crate) fn lazy_head(self) -> bool {
        self == KeyLayout::Tagged
    }

    /// The key of `channel`'s meta in the `channels` keyspace.
    pub(crate) fn channel_key(self, channel: &str) -> Vec<u8> {
        let mut key = Vec::with_capacity(TAG_LEN + channel.len());
        if self == KeyLayout::Tagged {
            key.extend_from_slice(&channel_tag(channel));
        }
        key.extend_from_slice(channel.as_bytes());
        key
    }

    /// The channel name of a `channels` key (checked against its tag).
    pub(crate) fn channel_of(self, key: &[u8]) -> Result<&str, CodecError> {
        let (tag, name) = match self {
            KeyLayout::Plain => (None, key),
            KeyLayout::Tagged => {
                let (tag, name) = key.split_at_checked(TAG_LEN).ok_or(bad("channel key"))?;
                (Some(tag), name)
            }
        };
        let name = std::str::from_utf8(name).map_err(|_| bad("channel key"))?;
        if tag.is_some_and(|t| t != channel_tag(name)) {
            return Err(bad("channel key"));
        }
        Ok(name)
    }

    /// The key of `seq` in `channel`'s log (one key; for several of a
    /// channel, [`KeyLayout::log`] makes their prefix once; the writer
    /// builds its keys with [`KeyLayout::push_log_key`]).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn log_key(self, channel: &str, seq: u64) -> Vec<u8> {
        let mut key = Vec::with_capacity(TAG_LEN + channel.len() + 9);
        self.push_log_key(&mut key, channel, seq);
        key
    }

    /// The key of `seq` in `channel`'s log, appended to `out`.
    pub(crate) fn push_log_key(self, out: &mut Vec<u8>, channel: &str, seq: u64) {
        self.push_log_prefix(out, channel);
        out.extend_from_slice(&seq.to_be_bytes());
    }

    /// The log keys of `channel`: their shared prefix (with its tag) made
    /// once, for scans and deletes of many entries.
    pub(crate) fn log(self, channel: &str) -> ChannelLogKeys {
        let mut prefix = Vec::with_capacity(TAG_LEN + channel.len() + 1);
        self.push_log_prefix(&mut prefix, channel);
        ChannelLogKeys { prefix }
    }

    /// `tag ++ channel ++ 0x00` (format 2) or `channel ++ 0x00` (format 1).
    fn push_log_prefix(self, out: &mut Vec<u8>, channel: &str) {
        if self == KeyLayout::Tagged {
            out.extend_from_slice(&channel_tag(channel));
        }
        out.extend_from_slice(channel.as_bytes());
        out.push(LOG_KEY_SEP);
    }
}

/// The log keys of one channel ([`KeyLayout::log`]).
pub(crate) struct ChannelLogKeys {
    prefix: Vec<u8>,
}

impl ChannelLogKeys {
    /// The key of `seq`.
    pub(crate) fn key(&self, seq: u64) -> Vec<u8> {
        let mut key = Vec::with_capacity(self.prefix.len() + 8);
        self.push_key(&mut key, seq);
        key
    }

    /// The key of `seq`, appended to `out`.
    pub(crate) fn push_key(&self, out: &mut Vec<u8>, seq: u64) {
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(&seq.to_be_bytes());
    }

    /// The seq of a key of this channel's log.
    pub(crate) fn seq(&self, key: &[u8]) -> Result<u64, CodecError> {
        let rest = key.strip_prefix(self.prefix.as_slice()).ok_or(bad("log key"))?;
        let seq: [u8; 8] = rest.try_into().map_err(|_| bad("log key"))?;
        Ok(u64::from_be_bytes(seq))
    }
}

const TAG_LEN: usize = 4;

/// The first four bytes (big-endian) of the channel name's XXH3-64: stable
/// across versions and machines (XXH3 is a specified hash without a seed
/// here), and part of the stored keys of format 2.
pub(crate) fn channel_tag(channel: &str) -> [u8; TAG_LEN] {
    let h = xxhash_rust::xxh3::xxh3_64(channel.as_bytes()).to_be_bytes();
    [h[0], h[1], h[2], h[3]]
}

/// The fixed header stored before each message frame. Kept outside the frame
/// so reads and the age sweeper never parse JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogHeader {
    pub ts: u64,
    pub id: Uuid,
}

/// `format ++ ts (u64 BE) ++ id (16 bytes) ++ frame`.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn encode_log_value(header: &LogHeader, frame: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(LOG_HEADER_LEN + frame.len());
    push_log_value(&mut v, header, frame);
    v
}

/// A log value (`format ++ ts (u64 BE) ++ id (16 bytes) ++ frame`),
/// appended to `out`.
pub(crate) fn push_log_value(out: &mut Vec<u8>, header: &LogHeader, frame: &[u8]) {
    out.reserve(LOG_HEADER_LEN + frame.len());
    out.push(FORMAT_V1);
    out.extend_from_slice(&header.ts.to_be_bytes());
    out.extend_from_slice(header.id.as_bytes());
    out.extend_from_slice(frame);
}

/// The header and the frame of a log value.
pub(crate) fn decode_log_value(v: &[u8]) -> Result<(LogHeader, &[u8]), CodecError> {
    let mut r = Reader::new(v, "log value");
    r.format()?;
    let ts = r.u64()?;
    let id = Uuid::from_bytes(r.array()?);
    Ok((LogHeader { ts, id }, r.rest()))
}

/// Where a channel's log stands, plus the retention the sweeper applies.
///
/// Invariant: `1 <= first <= head + 1`; the log holds exactly the seqs
/// `first..=head`. A change of `first`, `max_age` or `closed` is written in
/// the same atomic batch as the log entries and deletions it goes with, so
/// those never disagree with the log, even after a crash. `head` is exact
/// in format 1 (written with every batch that appends); in format 2 the
/// stored `head` is where it was at the last meta write and the head is
/// the greater of it and the channel's last log entry ([`KeyLayout::lazy_head`]).
/// Once `closed`, it stays closed and `head` stays where it is (the closing
/// append writes the meta).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChannelMeta {
    pub head: u64,
    pub first: u64,
    /// Age limit from the channel's latest append; applied by the sweeper.
    pub max_age: Option<Duration>,
    /// Closed: `head` is the final message; every append is refused.
    pub closed: bool,
}

impl Default for ChannelMeta {
    /// A channel never written.
    fn default() -> Self {
        Self { head: 0, first: 1, max_age: None, closed: false }
    }
}

impl ChannelMeta {
    /// Format 2: `format ++ head ++ first ++ has_max_age (u8) ++ max_age_ms
    /// ++ closed (u8)`. Format 1, which a data dir may still hold and which
    /// is still decoded (as an open channel), is the same without `closed`.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(1 + 8 + 8 + 1 + 8 + 1);
        v.push(FORMAT_V2);
        v.extend_from_slice(&self.head.to_be_bytes());
        v.extend_from_slice(&self.first.to_be_bytes());
        let age_ms = self.max_age.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        v.push(u8::from(age_ms.is_some()));
        v.extend_from_slice(&age_ms.unwrap_or(0).to_be_bytes());
        v.push(u8::from(self.closed));
        v
    }

    pub fn decode(v: &[u8]) -> Result<Self, CodecError> {
        let mut r = Reader::new(v, "channel meta");
        let format = r.format_of(&[FORMAT_V1, FORMAT_V2])?;
        let head = r.u64()?;
        let first = r.u64()?;
        let has_age = r.u8()?;
        let age_ms = r.u64()?;
        let closed = match format {
            FORMAT_V1 => false,
            _ => match r.u8()? {
                0 => false,
                1 => true,
                _ => return Err(bad("channel meta (closed flag)")),
            },
        };
        r.end()?;
        if first == 0 || first > head.saturating_add(1) {
            return Err(bad("channel meta (first out of range)"));
        }
        let max_age = (has_age != 0).then(|| Duration::from_millis(age_ms));
        Ok(Self { head, first, max_age, closed })
    }
}

/// A stored idempotency receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IdemRecord {
    pub fingerprint: [u8; 32],
    pub channel: String,
    /// `None` for a volatile append.
    pub seq: Option<u64>,
    pub id: Uuid,
    pub ts: u64,
    pub epoch: String,
    /// Ms since the Unix epoch; the record counts as absent from then on.
    pub expires_at: u64,
}

impl IdemRecord {
    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expires_at <= now_ms
    }

    /// `format ++ fingerprint ++ has_seq (u8) ++ seq ++ id ++ ts ++ expires_at
    /// ++ channel_len (u16) ++ channel ++ epoch_len (u16) ++ epoch`.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.push_encoded(&mut v);
        v
    }

    /// The encoding, appended to `out`.
    pub fn push_encoded(&self, out: &mut Vec<u8>) {
        out.reserve(1 + 32 + 1 + 8 + 16 + 8 + 8 + 4 + self.channel.len() + self.epoch.len());
        out.push(FORMAT_V1);
        out.extend_from_slice(&self.fingerprint);
        out.push(u8::from(self.seq.is_some()));
        out.extend_from_slice(&self.seq.unwrap_or(0).to_be_bytes());
        out.extend_from_slice(self.id.as_bytes());
        out.extend_from_slice(&self.ts.to_be_bytes());
        out.extend_from_slice(&self.expires_at.to_be_bytes());
        put_str(out, &self.channel);
        put_str(out, &self.epoch);
    }

    pub fn decode(v: &[u8]) -> Result<Self, CodecError> {
        let mut r = Reader::new(v, "idempotency record");
        r.format()?;
        let fingerprint = r.array()?;
        let has_seq = r.u8()?;
        let seq = r.u64()?;
        let id = Uuid::from_bytes(r.array()?);
        let ts = r.u64()?;
        let expires_at = r.u64()?;
        let channel = r.str()?;
        let epoch = r.str()?;
        r.end()?;
        Ok(Self { fingerprint, channel, seq: (has_seq != 0).then_some(seq), id, ts, epoch, expires_at })
    }
}

/// `expires_at (u64 BE) ++ dedup key`: the expiry index, so the sweeper
/// finds expired receipts with one range scan instead of a full scan.
pub(crate) fn idem_exp_key(expires_at: u64, dedup_key: &[u8]) -> Vec<u8> {
    exp_key(expires_at, dedup_key)
}

/// [`idem_exp_key`] appended to `out`.
pub(crate) fn push_idem_exp_key(out: &mut Vec<u8>, expires_at: u64, dedup_key: &[u8]) {
    push_exp_key(out, expires_at, dedup_key);
}

/// The expiry and the dedup key of an expiry-index key.
pub(crate) fn split_idem_exp_key(k: &[u8]) -> Result<(u64, &[u8]), CodecError> {
    split_exp_key(k, "receipt expiry key")
}

/// Separates a channel from a subscriber key (in `cursors`) and a
/// subscriber key from a channel (in `user_cursors`). Neither channel names
/// nor subscriber keys contain `\0` (subscriber ids have no control
/// characters), so the first `\0` of a key is always this separator.
const CURSOR_KEY_SEP: u8 = 0;

/// `channel ++ 0x00`: the common prefix of a channel's cursor keys (one
/// contiguous range, as with log keys).
pub(crate) fn cursor_prefix(channel: &str) -> Vec<u8> {
    joined(channel, CURSOR_KEY_SEP, "")
}

/// `channel ++ 0x00 ++ subscriber key` (see `SubscriberId::key`).
pub(crate) fn cursor_key(channel: &str, subscriber_key: &str) -> Vec<u8> {
    joined(channel, CURSOR_KEY_SEP, subscriber_key)
}

/// The subscriber key of a cursor key of `channel`.
pub(crate) fn cursor_key_subscriber<'a>(channel: &str, key: &'a [u8]) -> Result<&'a str, CodecError> {
    let rest = key
        .strip_prefix(channel.as_bytes())
        .and_then(|r| r.strip_prefix(&[CURSOR_KEY_SEP]))
        .ok_or(bad("cursor key"))?;
    std::str::from_utf8(rest).map_err(|_| bad("cursor key"))
}

/// `subscriber key ++ 0x00 ++ channel`: the per-user index. A subscriber
/// key starts with `SubscriberId::user_prefix(user)` exactly when it is one
/// of `user`'s, and that prefix has no `\0`, so a user's index entries are
/// one prefix range, devices and channels together.
pub(crate) fn user_cursor_key(subscriber_key: &str, channel: &str) -> Vec<u8> {
    joined(subscriber_key, CURSOR_KEY_SEP, channel)
}

/// The subscriber key and the channel of a `user_cursors` key.
pub(crate) fn split_user_cursor_key(key: &[u8]) -> Result<(&str, &str), CodecError> {
    split_joined(key, CURSOR_KEY_SEP, "user cursor key")
}

/// A stored cursor: the highest seq acked and when it was acked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CursorRecord {
    pub seq: u64,
    pub acked_at_ms: u64,
}

impl CursorRecord {
    /// `format ++ seq ++ acked_at_ms`.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(1 + 8 + 8);
        v.push(FORMAT_V1);
        v.extend_from_slice(&self.seq.to_be_bytes());
        v.extend_from_slice(&self.acked_at_ms.to_be_bytes());
        v
    }

    pub fn decode(v: &[u8]) -> Result<Self, CodecError> {
        let mut r = Reader::new(v, "cursor");
        r.format()?;
        let seq = r.u64()?;
        let acked_at_ms = r.u64()?;
        r.end()?;
        Ok(Self { seq, acked_at_ms })
    }

    pub fn state(&self) -> herald_core::CursorState {
        herald_core::CursorState { seq: self.seq, acked_at_ms: self.acked_at_ms }
    }
}

/// Separates the channel from the member key in `presence` keys (and in
/// `presence_exp` keys, after the expiry). Channel names never contain
/// `\0`, so the first `\0` after the channel is always this separator
/// whatever the member key holds, and a channel's leases are one
/// contiguous key range.
const PRESENCE_KEY_SEP: u8 = 0;

/// `channel ++ 0x00`: the common prefix of a channel's lease keys.
pub(crate) fn presence_prefix(channel: &str) -> Vec<u8> {
    joined(channel, PRESENCE_KEY_SEP, "")
}

/// `channel ++ 0x00 ++ member key` (see `herald_core::member_key`).
pub(crate) fn presence_key(channel: &str, member_key: &str) -> Vec<u8> {
    joined(channel, PRESENCE_KEY_SEP, member_key)
}

/// The channel and the member key of a `presence` key.
pub(crate) fn split_presence_key(key: &[u8]) -> Result<(&str, &str), CodecError> {
    split_joined(key, PRESENCE_KEY_SEP, "presence key")
}

/// `expires_at_ms (u64 BE) ++ presence key`: the lease expiry index, in
/// expiry order, so `presence_expire` finds expired leases with one range
/// scan.
pub(crate) fn presence_exp_key(expires_at_ms: u64, presence_key: &[u8]) -> Vec<u8> {
    exp_key(expires_at_ms, presence_key)
}

/// The expiry and the presence key of a `presence_exp` key.
pub(crate) fn split_presence_exp_key(k: &[u8]) -> Result<(u64, &[u8]), CodecError> {
    split_exp_key(k, "lease expiry key")
}

/// `first ++ sep ++ rest`, in one allocation: a key of two text parts where
/// `first` never contains `sep`, so the first `sep` splits it back.
fn joined(first: &str, sep: u8, rest: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(first.len() + 1 + rest.len());
    key.extend_from_slice(first.as_bytes());
    key.push(sep);
    key.extend_from_slice(rest.as_bytes());
    key
}

/// The two parts of a [`joined`] key; `what` names the key in the error.
fn split_joined<'a>(key: &'a [u8], sep: u8, what: &'static str) -> Result<(&'a str, &'a str), CodecError> {
    let at = key.iter().position(|&b| b == sep).ok_or(bad(what))?;
    let first = std::str::from_utf8(&key[..at]).map_err(|_| bad(what))?;
    let rest = std::str::from_utf8(&key[at + 1..]).map_err(|_| bad(what))?;
    Ok((first, rest))
}

/// `at (u64 BE) ++ key`: an expiry index entry, in expiry order.
fn exp_key(at: u64, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + key.len());
    push_exp_key(&mut k, at, key);
    k
}

/// [`exp_key`] appended to `out`.
#[inline]
fn push_exp_key(out: &mut Vec<u8>, at: u64, key: &[u8]) {
    out.extend_from_slice(&at.to_be_bytes());
    out.extend_from_slice(key);
}

/// The expiry and the key of an [`exp_key`]; `what` names it in the error.
fn split_exp_key<'a>(k: &'a [u8], what: &'static str) -> Result<(u64, &'a [u8]), CodecError> {
    let (exp, key) = k.split_first_chunk::<8>().ok_or(bad(what))?;
    Ok((u64::from_be_bytes(*exp), key))
}

/// A stored lease: its fencing token, its expiry and the member as JSON
/// (`herald_proto::Member`, whose `info` is arbitrary JSON).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LeaseRecord {
    pub token: u64,
    pub expires_at_ms: u64,
    pub member: herald_proto::Member,
}

impl LeaseRecord {
    /// `format ++ token ++ expires_at_ms ++ member JSON`.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(1 + 8 + 8 + 64);
        v.push(FORMAT_V1);
        v.extend_from_slice(&self.token.to_be_bytes());
        v.extend_from_slice(&self.expires_at_ms.to_be_bytes());
        serde_json::to_writer(&mut v, &self.member).expect("a member always serialises");
        v
    }

    pub fn decode(v: &[u8]) -> Result<Self, CodecError> {
        let (token, expires_at_ms) = Self::decode_header(v)?;
        let member = serde_json::from_slice(&v[LEASE_HEADER_LEN..]).map_err(|_| bad("lease member"))?;
        Ok(Self { token, expires_at_ms, member })
    }

    /// Token and expiry only, without parsing the member (for counting).
    pub fn decode_header(v: &[u8]) -> Result<(u64, u64), CodecError> {
        let mut r = Reader::new(v, "lease");
        r.format()?;
        Ok((r.u64()?, r.u64()?))
    }

    pub fn lease(self) -> herald_core::Lease {
        herald_core::Lease { member: self.member, token: self.token, expires_at_ms: self.expires_at_ms }
    }
}

/// Bytes before the member JSON in a lease value: format, token, expiry.
const LEASE_HEADER_LEN: usize = 1 + 8 + 8;

/// `format ++ last token (u64)`: the last fencing token a channel handed
/// out (in `presence_tokens`, by channel). Never deleted.
pub(crate) fn encode_token(token: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(9);
    v.push(FORMAT_V1);
    v.extend_from_slice(&token.to_be_bytes());
    v
}

pub(crate) fn decode_token(v: &[u8]) -> Result<u64, CodecError> {
    let mut r = Reader::new(v, "presence token");
    r.format()?;
    let token = r.u64()?;
    r.end()?;
    Ok(token)
}

/// `format ++ room JSON` (the serde form of `herald_core::Room`, shared by
/// every engine).
pub(crate) fn encode_room(room: &herald_core::Room) -> Vec<u8> {
    let mut v = vec![FORMAT_V1];
    serde_json::to_writer(&mut v, room).expect("a room always serialises");
    v
}

pub(crate) fn decode_room(v: &[u8]) -> Result<herald_core::Room, CodecError> {
    let mut r = Reader::new(v, "room");
    r.format()?;
    serde_json::from_slice(r.rest()).map_err(|_| bad("room"))
}

/// Strings are bounded by the callers (channel names <= 255 bytes, epochs are
/// UUIDs); the u16 length saturates rather than panics.
fn put_str(v: &mut Vec<u8>, s: &str) {
    let len = u16::try_from(s.len()).unwrap_or(u16::MAX);
    v.extend_from_slice(&len.to_be_bytes());
    v.extend_from_slice(&s.as_bytes()[..usize::from(len)]);
}

/// A bounds-checked cursor over a value.
struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], what: &'static str) -> Self {
        Self { buf, what }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        if self.buf.len() < n {
            return Err(bad(self.what));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], CodecError> {
        self.take(N)?.try_into().map_err(|_| bad(self.what))
    }

    fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.array::<1>()?[0])
    }

    fn u64(&mut self) -> Result<u64, CodecError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    fn str(&mut self) -> Result<String, CodecError> {
        let len = u16::from_be_bytes(self.array()?);
        let bytes = self.take(usize::from(len))?;
        String::from_utf8(bytes.to_vec()).map_err(|_| bad(self.what))
    }

    fn format(&mut self) -> Result<(), CodecError> {
        self.format_of(&[FORMAT_V1]).map(drop)
    }

    /// The format byte, if it is one of `known`.
    fn format_of(&mut self, known: &[u8]) -> Result<u8, CodecError> {
        let format = self.u8()?;
        if known.contains(&format) {
            Ok(format)
        } else {
            Err(bad(self.what))
        }
    }

    fn rest(self) -> &'a [u8] {
        self.buf
    }

    fn end(self) -> Result<(), CodecError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(bad(self.what))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channels_log_keys_are_contiguous_and_in_seq_order_in_both_layouts() {
        // Channels that are prefixes of one another, seqs across byte widths.
        let channels = ["a", "a:", "a:b", "ab", "chat:1", "chat:10"];
        let seqs = [1, 2, 255, 256, u64::MAX];
        for keys in [KeyLayout::Plain, KeyLayout::Tagged] {
            let mut all: Vec<(Vec<u8>, &str, u64)> = channels
                .iter()
                .flat_map(|c| seqs.iter().map(move |&s| (keys.log_key(c, s), *c, s)))
                .collect();
            all.sort();
            for c in channels {
                let at: Vec<usize> =
                    all.iter().enumerate().filter(|(_, k)| k.1 == c).map(|(i, _)| i).collect();
                assert_eq!(at.last().unwrap() - at[0] + 1, seqs.len(), "{keys:?}: {c}'s keys are one range");
                let in_order: Vec<u64> = at.iter().map(|&i| all[i].2).collect();
                assert_eq!(in_order, seqs, "{keys:?}: {c}'s keys in seq order");
            }
            assert_eq!(keys.log("a:b").seq(&keys.log_key("a:b", 256)), Ok(256));
            assert_eq!(keys.log("a:b").key(256), keys.log_key("a:b", 256));
            assert!(keys.log("a").seq(&keys.log_key("a:b", 1)).is_err());
            assert!(keys.log("a:b").seq(&keys.log_key("a", 1)).is_err());
        }
        assert_eq!(KeyLayout::Plain.log_key("a", 1), b"a\0\0\0\0\0\0\0\0\x01");
        let tagged = KeyLayout::Tagged.log_key("a", 1);
        assert_eq!(
            (&tagged[..4], &tagged[4..]),
            (&channel_tag("a")[..], &KeyLayout::Plain.log_key("a", 1)[..])
        );
        for layout in [KeyLayout::Plain, KeyLayout::Tagged] {
            for c in channels {
                assert_eq!(layout.channel_of(&layout.channel_key(c)), Ok(c), "{layout:?}");
            }
        }
        assert_eq!(KeyLayout::Plain.channel_key("chat:1"), b"chat:1");
        let mut wrong_tag = KeyLayout::Tagged.channel_key("chat:1");
        wrong_tag[0] ^= 1;
        assert!(
            KeyLayout::Tagged.channel_of(&wrong_tag).is_err(),
            "a tag that is not the name's is corruption"
        );
        assert!(KeyLayout::Tagged.channel_of(b"abc").is_err(), "shorter than a tag");
        // Stored in data dirs: the tag must never change.
        assert_eq!(channel_tag("chat:1"), [167, 249, 141, 222], "the tag is stored: it must never change");
    }

    #[test]
    fn log_value_round_trips() {
        let header = LogHeader { ts: 1_700_000_000_123, id: Uuid::now_v7() };
        let v = encode_log_value(&header, br#"{"type":"message"}"#);
        let (h, frame) = decode_log_value(&v).unwrap();
        assert_eq!(h, header);
        assert_eq!(frame, br#"{"type":"message"}"#);
        assert!(decode_log_value(&v[..10]).is_err());
    }

    #[test]
    fn channel_meta_round_trips_and_rejects_bad_ranges() {
        for meta in [
            ChannelMeta::default(),
            ChannelMeta { head: 10, first: 4, max_age: Some(Duration::from_secs(3600)), closed: false },
            ChannelMeta { head: 10, first: 11, max_age: None, closed: true },
        ] {
            assert_eq!(ChannelMeta::decode(&meta.encode()), Ok(meta));
        }
        let bad = ChannelMeta { head: 3, first: 5, max_age: None, closed: false }.encode();
        assert!(ChannelMeta::decode(&bad).is_err());
        let mut flag = ChannelMeta::default().encode();
        *flag.last_mut().unwrap() = 2;
        assert!(ChannelMeta::decode(&flag).is_err(), "a closed flag is 0 or 1");
        let mut future = ChannelMeta::default().encode();
        future[0] = 3;
        assert!(ChannelMeta::decode(&future).is_err(), "an unknown format is not guessed at");
    }

    /// Format 1 metas (exactly these bytes, without `closed`) decode as
    /// open channels.
    #[test]
    fn channel_meta_format_1_still_decodes() {
        let mut v1 = vec![1u8];
        v1.extend_from_slice(&10u64.to_be_bytes());
        v1.extend_from_slice(&4u64.to_be_bytes());
        v1.push(1);
        v1.extend_from_slice(&3_600_000u64.to_be_bytes());
        let meta = ChannelMeta::decode(&v1).unwrap();
        assert_eq!(
            meta,
            ChannelMeta { head: 10, first: 4, max_age: Some(Duration::from_secs(3600)), closed: false }
        );
        assert_eq!(meta.encode()[0], 2, "rewritten in the current format");
        let mut trailing = v1.clone();
        trailing.push(0);
        assert!(ChannelMeta::decode(&trailing).is_err(), "format 1 has no closed flag");
    }

    #[test]
    fn idem_record_round_trips() {
        let rec = IdemRecord {
            fingerprint: [7; 32],
            channel: "chat:1".into(),
            seq: Some(42),
            id: Uuid::now_v7(),
            ts: 5,
            epoch: "e".into(),
            expires_at: 99,
        };
        assert_eq!(IdemRecord::decode(&rec.encode()), Ok(rec.clone()));
        let volatile = IdemRecord { seq: None, ..rec };
        assert_eq!(IdemRecord::decode(&volatile.encode()), Ok(volatile.clone()));
        assert!(volatile.is_expired(99) && !volatile.is_expired(98));
    }

    #[test]
    fn cursor_keys_group_by_channel_and_user_keys_by_user() {
        use herald_core::SubscriberId;
        let sub = |u: &str, d: Option<&str>| SubscriberId::new(u, d.map(Into::into)).unwrap().key();
        let k = cursor_key("a", &sub("u", Some("d")));
        assert!(k.starts_with(&cursor_prefix("a")));
        assert!(!cursor_key("a:b", &sub("u", None)).starts_with(&cursor_prefix("a")));
        assert_eq!(cursor_key_subscriber("a", &k), Ok("1:u1:d"));
        assert!(cursor_key_subscriber("a:", &k).is_err());

        let uk = user_cursor_key(&sub("u", Some("d")), "chat:1");
        assert_eq!(split_user_cursor_key(&uk), Ok(("1:u1:d", "chat:1")));
        let prefix = SubscriberId::user_prefix("u").unwrap();
        assert!(uk.starts_with(prefix.as_bytes()));
        assert!(!user_cursor_key(&sub("u1", None), "chat:1").starts_with(prefix.as_bytes()));

        let rec = CursorRecord { seq: 9, acked_at_ms: 1_700_000_000_000 };
        assert_eq!(CursorRecord::decode(&rec.encode()), Ok(rec));
        assert!(CursorRecord::decode(&rec.encode()[..9]).is_err());
    }

    #[test]
    fn presence_keys_group_by_channel_and_expiry_keys_sort_by_time() {
        let k = presence_key("room:1", "5:alicec1");
        assert!(k.starts_with(&presence_prefix("room:1")));
        assert!(!presence_key("room:10", "5:alicec1").starts_with(&presence_prefix("room:1")));
        assert_eq!(split_presence_key(&k), Ok(("room:1", "5:alicec1")));
        assert!(split_presence_key(b"no separator").is_err());

        let early = presence_exp_key(5, &presence_key("z", "1:u"));
        let late = presence_exp_key(256, &presence_key("a", "1:u"));
        assert!(early < late, "expiry order first, whatever the channel");
        assert_eq!(split_presence_exp_key(&late), Ok((256, &presence_key("a", "1:u")[..])));
        assert!(split_presence_exp_key(b"short").is_err());
    }

    #[test]
    fn lease_token_and_room_values_round_trip() {
        let member = herald_proto::Member {
            client_id: "c1".into(),
            user: "alice".into(),
            device: Some("phone".into()),
            info: Some(serde_json::json!({"name": "Alice", "n": [1, 2]})),
        };
        let rec = LeaseRecord { token: 7, expires_at_ms: 1_700_000_000_000, member };
        let v = rec.encode();
        assert_eq!(LeaseRecord::decode(&v), Ok(rec.clone()));
        assert_eq!(LeaseRecord::decode_header(&v), Ok((7, 1_700_000_000_000)));
        assert!(LeaseRecord::decode(&v[..LEASE_HEADER_LEN + 2]).is_err());

        assert_eq!(decode_token(&encode_token(u64::MAX)), Ok(u64::MAX));
        assert!(decode_token(&encode_token(1)[..5]).is_err());

        let room = herald_core::Room::new("alice".into(), Default::default(), 30_000, 5);
        let grace = room.change(Some(herald_core::RoomStatus::Live), None, 6).unwrap();
        let grace = grace.change(Some(herald_core::RoomStatus::Grace), None, 7).unwrap();
        assert_eq!(decode_room(&encode_room(&grace)), Ok(grace));
        assert!(decode_room(b"\x01{").is_err());
    }

    #[test]
    fn expiry_keys_sort_by_time() {
        let a = idem_exp_key(5, b"zzz");
        let b = idem_exp_key(6, b"aaa");
        assert!(a < b);
        assert_eq!(split_idem_exp_key(&b), Ok((6, &b"aaa"[..])));
    }
}
