//! Fuzz harness of the stored-record codec (`fuzz/` target `store_codec`):
//! whatever bytes the data dir holds, decoding them is an error or a value,
//! never a panic, and every decoded value encodes back to what decodes to
//! it. The test below replays the target's seeds and kept regression inputs.

use herald_core::SubscriberId;
use herald_proto::StoredFrame;

use crate::codec::{self, ChannelMeta, CursorRecord, IdemRecord, LeaseRecord};

/// `fuzz/` target `store_codec`: `bytes` read as every kind of stored value,
/// and (split as `channel length (u8) ++ channel ++ key`) as every kind of
/// stored key.
pub fn codec(bytes: &[u8]) {
    if let Ok((header, frame)) = codec::decode_log_value(bytes) {
        assert_eq!(codec::encode_log_value(&header, frame), bytes);
        // What history does with a stored frame: an error, never a panic.
        let _ = StoredFrame::parse(frame);
    }
    if let Ok(meta) = ChannelMeta::decode(bytes) {
        assert!(meta.first >= 1 && meta.first <= meta.head.saturating_add(1), "{meta:?}");
        assert_eq!(ChannelMeta::decode(&meta.encode()), Ok(meta));
    }
    if let Ok(rec) = IdemRecord::decode(bytes) {
        assert_eq!(IdemRecord::decode(&rec.encode()).as_ref(), Ok(&rec));
    }
    if let Ok(rec) = CursorRecord::decode(bytes) {
        assert_eq!(rec.encode(), bytes);
    }
    if let Ok(rec) = LeaseRecord::decode(bytes) {
        // `info` is any JSON: compared as decoded again, not as bytes.
        let again = LeaseRecord::decode(&rec.encode()).expect("an encoded lease decodes");
        assert_eq!((again.token, again.expires_at_ms), (rec.token, rec.expires_at_ms));
        assert_eq!((&again.member.client_id, &again.member.user), (&rec.member.client_id, &rec.member.user));
    }
    if let Ok(token) = codec::decode_token(bytes) {
        assert_eq!(codec::encode_token(token), bytes);
    }
    if let Ok(room) = codec::decode_room(bytes) {
        let again = codec::decode_room(&codec::encode_room(&room)).expect("an encoded room decodes");
        assert_eq!((again.state, again.version, &again.host), (room.state, room.version, &room.host));
    }
    keys(bytes);
}

fn keys(bytes: &[u8]) {
    if let Ok((exp, key)) = codec::split_idem_exp_key(bytes) {
        assert_eq!(codec::idem_exp_key(exp, key), bytes);
    }
    if let Ok((exp, key)) = codec::split_presence_exp_key(bytes) {
        assert_eq!(codec::presence_exp_key(exp, key), bytes);
    }
    if let Ok((sub, channel)) = codec::split_user_cursor_key(bytes) {
        assert_eq!(codec::user_cursor_key(sub, channel), bytes);
        subscriber_key(sub);
    }
    if let Ok((channel, member)) = codec::split_presence_key(bytes) {
        assert_eq!(codec::presence_key(channel, member), bytes);
    }
    let Some((&n, rest)) = bytes.split_first() else { return };
    let Some((channel, key)) = rest.split_at_checked(usize::from(n)) else { return };
    let Ok(channel) = std::str::from_utf8(channel) else { return };
    for keys in [codec::KeyLayout::Plain, codec::KeyLayout::Tagged] {
        if let Ok(seq) = keys.log(channel).seq(key) {
            assert_eq!(keys.log_key(channel, seq), key);
        }
        if let Ok(name) = keys.channel_of(bytes) {
            assert_eq!(keys.channel_key(name), bytes);
        }
    }
    if let Ok(sub) = codec::cursor_key_subscriber(channel, key) {
        assert_eq!(codec::cursor_key(channel, sub), key);
        subscriber_key(sub);
    }
}

/// A stored subscriber key parses only if it is exactly some id's key.
fn subscriber_key(key: &str) {
    if let Ok(id) = SubscriberId::parse_key(key) {
        assert_eq!(id.key(), key);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn store_codec_inputs_pass() {
        herald_proto::fuzzing::replay("store_codec", super::codec);
    }
}
