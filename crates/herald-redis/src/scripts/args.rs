//! The arguments of every script, one struct each: its fields are the
//! script's `KEYS` then its `ARGV`, named, and [`ScriptArgs::invocation`]
//! pushes them in the script's order (the order of the fields; a message's
//! `retention` is its `max_len, max_age_ms` and its `frame` the template's
//! `head, tail`: the scripts build the middle from the id, see
//! `FrameTemplate::middle_is_built_from`). Each `.lua` file starts with a
//! header naming its `KEYS` and `ARGV` in order; a unit test checks every
//! header against these structs.
//!
//! Arguments borrow what the caller already holds (frames, ids, channel
//! names): an invocation copies each argument once, as it would anyway.

use herald_core::{Dedup, Retention};
use herald_proto::ChannelName;
use redis::{RedisWrite, ScriptInvocation, ToRedisArgs};

use crate::frame::FrameTemplate;
use crate::keys::{Keys, LeaseKeys};
use crate::state::ms;

/// A script's arguments.
pub(crate) trait ScriptArgs {
    /// The script run with these arguments, pushed in its order.
    fn invocation(&self) -> ScriptInvocation<'static>;
}

/// What a script's header must say: the names of its arguments in the
/// order its argument struct (or run builder) pushes them. Checked by a
/// unit test against the `.lua` file.
#[cfg(test)]
pub(crate) trait ScriptHeader {
    /// The script's `.lua` file.
    const SOURCE: &'static str;
    /// The names of the `KEYS`, in order (an optional key in brackets).
    fn keys() -> Vec<String>;
    /// The names of the `ARGV`, in order.
    fn argv() -> Vec<String>;
}

/// A key argument: a key, (last) an optional one, or a group of keys
/// always passed together ([`LeaseKeys`]).
pub(crate) trait Key: ToRedisArgs {
    /// The names of the keys a field `field` of this type pushes, as the
    /// script header names them.
    #[cfg(test)]
    fn names(field: &str) -> Vec<String> {
        vec![field.to_owned()]
    }
}

impl Key for String {}

impl Key for &str {}

/// Pushes nothing when `None`: only the last key may be optional.
impl Key for Option<String> {
    #[cfg(test)]
    fn names(field: &str) -> Vec<String> {
        vec![format!("[{field}]")]
    }
}

/// Pushes its five keys, in the order of its fields.
impl Key for LeaseKeys {
    #[cfg(test)]
    fn names(_: &str) -> Vec<String> {
        ["presence", "presence_exp", "presence_keys", "presence_gone", "presence_gone_exp"]
            .map(String::from)
            .to_vec()
    }
}

impl ToRedisArgs for LeaseKeys {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        for k in [
            &self.presence,
            &self.presence_exp,
            &self.presence_keys,
            &self.presence_gone,
            &self.presence_gone_exp,
        ] {
            k.write_redis_args(out);
        }
    }
}

/// Push a key (only a [`Key`] may be one).
fn key<K: Key>(inv: &mut ScriptInvocation<'static>, k: &K) {
    inv.key(k);
}

/// An argument that may be absent, sent as `''` (it keeps its position,
/// unlike an `Option`, which sends nothing).
pub(crate) struct OrEmpty<T>(pub Option<T>);

impl<T: ToRedisArgs> ToRedisArgs for OrEmpty<T> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        match &self.0 {
            Some(v) => v.write_redis_args(out),
            None => out.write_arg(b""),
        }
    }
}

/// Declares one script's argument struct: its keys (`String`, or
/// `Option<String>` for an optional last key), its arguments (anything
/// `ToRedisArgs` that sends exactly one argument), and optionally a
/// trailing group of arguments ([`Event`]).
macro_rules! script_args {
    ($(
        $(#[$doc:meta])*
        $name:ident $(<$lt:lifetime>)? => $script:ident, $file:literal {
            keys { $($key:ident: $kty:ty),* $(,)? }
            argv { $($arg:ident: $aty:ty),* $(,)? }
            $(then $group:ident: $gty:ty)?
        }
    )*) => { $(
        $(#[$doc])*
        pub(crate) struct $name $(<$lt>)? {
            $(pub $key: $kty,)*
            $(pub $arg: $aty,)*
            $(pub $group: $gty,)?
        }

        impl $(<$lt>)? ScriptArgs for $name $(<$lt>)? {
            fn invocation(&self) -> ScriptInvocation<'static> {
                #[allow(unused_mut)]
                let mut inv = super::$script.prepare_invoke();
                $(key(&mut inv, &self.$key);)*
                $(inv.arg(&self.$arg);)*
                $(self.$group.push(&mut inv);)?
                inv
            }
        }

        #[cfg(test)]
        impl $(<$lt>)? ScriptHeader for $name $(<$lt>)? {
            const SOURCE: &'static str = include_str!($file);

            fn keys() -> Vec<String> {
                [$(<$kty as Key>::names(stringify!($key))),*].concat()
            }

            fn argv() -> Vec<String> {
                #[allow(unused_mut)]
                let mut v: Vec<String> = vec![$(stringify!($arg).to_owned()),*];
                $(v.extend(<$gty>::names().iter().map(|n| n.to_string()));)?
                v
            }
        }
    )* };
}

/// A message's `max_age_ms` argument: 0 for no age limit.
fn max_age_ms(retention: &Retention) -> u64 {
    retention.max_age.map_or(0, ms)
}

/// The arguments of a message appended by `ROOM_WRITE` or `SCHED_DELIVER`
/// (last, in this order); built by `EngineState::event`.
pub(crate) struct Event<'a> {
    /// A fresh epoch, used if the channel has none.
    pub epoch: String,
    pub retention: &'a Retention,
    /// The frame around its seq and ts.
    pub frame: &'a FrameTemplate,
    /// The message id.
    pub id: &'a str,
    pub channel: &'a str,
    /// The fan-out pub/sub channel.
    pub fan: String,
    /// `PUBLISH`, or `SPUBLISH` on a cluster.
    pub publish: &'static str,
}

impl Event<'_> {
    fn push(&self, inv: &mut ScriptInvocation<'static>) {
        debug_assert!(self.frame.middle_is_built_from(self.id), "the scripts build the frame's middle");
        inv.arg(&self.epoch)
            .arg(self.retention.max_len)
            .arg(max_age_ms(self.retention))
            .arg(self.frame.head())
            .arg(self.frame.tail())
            .arg(self.id)
            .arg(self.channel)
            .arg(&self.fan)
            .arg(self.publish);
    }

    #[cfg(test)]
    fn names() -> [&'static str; 9] {
        ["epoch", "max_len", "max_age_ms", "head", "tail", "id", "channel", "fan", "publish"]
    }
}

/// `APPEND`'s arguments: [`Append::begin`] starts the command,
/// [`AppendRun::channel`] adds a channel and [`AppendRun::message`] each of
/// its messages, in order, so a batch's messages are pushed as they are
/// built. One command holds one or more channels (on a cluster, one: a
/// script's keys must share a slot).
///
/// Unlike the other scripts' invocations, a run is written straight into
/// one `EVALSHA` command: its `KEYS` and `ARGV` each go into one buffer as
/// they are built (no allocation per argument, keys and hex written in
/// place), and are copied into the command once.
pub(crate) struct Append<'a> {
    pub publish: &'static str,
    /// A fresh epoch, used by a channel that has none (one per run serves
    /// every channel in it: a channel takes a new epoch at most once per
    /// run).
    pub epoch: &'a str,
}

/// One channel of an `APPEND` run, followed by its messages (one or
/// more). Its keys (`meta`, `log`) and its `fan` are the channel's
/// (`Keys`).
pub(crate) struct AppendChannel<'a> {
    pub keys: &'a Keys,
    pub channel: &'a ChannelName,
}

/// One message of an `APPEND` run.
pub(crate) struct AppendMessage<'a> {
    pub durable: bool,
    pub retention: &'a Retention,
    /// The frame around its seq and ts.
    pub frame: &'a FrameTemplate,
    pub id: &'a str,
    /// Durable only: the channel's last message.
    pub closes: bool,
    /// With dedup: its receipt key (the channel's) is the next key, the
    /// message's `receipt` flag says so, and its fingerprint (as hex) and
    /// the receipt's TTL follow the message's other arguments.
    pub dedup: Option<&'a Dedup>,
}

/// Arguments written one after another into one buffer.
#[derive(Default)]
struct ArgBuf {
    data: Vec<u8>,
    ends: Vec<usize>,
}

impl ArgBuf {
    fn push(&mut self, bytes: &[u8]) {
        self.data.extend_from_slice(bytes);
        self.ends.push(self.data.len());
    }

    fn push_u64(&mut self, n: u64) {
        self.push(itoa::Buffer::new().format(n).as_bytes());
    }

    /// One argument, written by `f` at the end of the buffer.
    fn push_with(&mut self, f: impl FnOnce(&mut Vec<u8>)) {
        f(&mut self.data);
        self.ends.push(self.data.len());
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let arg = &self.data[start..end];
            start = end;
            arg
        })
    }
}

/// A receipt's arguments: the message's fingerprint as 64 hex digits and
/// the receipt's TTL in ms.
fn push_receipt(argv: &mut ArgBuf, dedup: &Dedup) {
    let mut text = [0u8; 64];
    hex::encode_to_slice(dedup.fingerprint, &mut text).expect("64 hex digits for 32 bytes");
    argv.push(&text);
    argv.push_u64(ms(dedup.ttl));
}

/// An `APPEND` command being built.
pub(crate) struct AppendRun {
    keys: ArgBuf,
    argv: ArgBuf,
    /// Messages pushed for the current channel (`None` before the first).
    messages: Option<usize>,
}

impl Append<'_> {
    pub fn begin(&self) -> AppendRun {
        let mut argv = ArgBuf::default();
        argv.push(self.publish.as_bytes());
        argv.push(self.epoch.as_bytes());
        AppendRun { keys: ArgBuf::default(), argv, messages: None }
    }
}

#[cfg(test)]
impl ScriptHeader for Append<'_> {
    const SOURCE: &'static str = include_str!("append.lua");

    fn keys() -> Vec<String> {
        vec!["(meta,log,receipt...)...".to_owned()]
    }

    fn argv() -> Vec<String> {
        let durable =
            ["d[c][r]", "max_len", "max_age_ms", "head", "id", "tail[", "fingerprint", "receipt_ttl_ms]"];
        let volatile = ["v[r]", "id", "head", "tail[", "fingerprint", "receipt_ttl_ms]"];
        let channel = ["c", "channel", "fan", "message..."];
        vec![
            "publish".to_owned(),
            "epoch".to_owned(),
            format!(
                "({})...;amessageisdurable:({})orvolatile:({})(thelasttwowithareceiptonly)",
                channel.join(","),
                durable.join(","),
                volatile.join(",")
            ),
        ]
    }
}

impl AppendRun {
    /// Start the next channel: one or more of its messages follow.
    pub fn channel(&mut self, c: AppendChannel<'_>) {
        debug_assert_ne!(self.messages, Some(0), "the previous channel has a message");
        self.keys.push_with(|out| c.keys.write_channel_key(out, c.channel, "meta"));
        self.keys.push_with(|out| c.keys.write_channel_key(out, c.channel, "log"));
        self.messages = Some(0);
        self.argv.push(b"c");
        self.argv.push(c.channel.as_str().as_bytes());
        self.argv.push_with(|out| c.keys.write_channel_key(out, c.channel, "fan"));
    }

    /// The next message of the current channel (`channel` is that one).
    pub fn message(&mut self, keys: &Keys, channel: &ChannelName, m: AppendMessage<'_>) {
        let Some(messages) = self.messages.as_mut() else {
            unreachable!("a message belongs to the channel before it");
        };
        *messages += 1;
        if let Some(d) = m.dedup {
            self.keys.push_with(|out| keys.write_receipt(out, channel, &d.key));
        }
        let receipt = m.dedup.is_some();
        debug_assert!(m.frame.middle_is_built_from(m.id), "the script builds the frame's middle");
        let argv = &mut self.argv;
        if !m.durable {
            // Volatile: no retention, never closes; the frame has no seq,
            // so its head runs up to its ts.
            argv.push(if receipt { b"vr" } else { b"v" });
            argv.push(m.id.as_bytes());
            argv.push(m.frame.head());
            argv.push(m.frame.tail());
        } else {
            argv.push(match (m.closes, receipt) {
                (false, false) => b"d",
                (true, false) => b"dc",
                (false, true) => b"dr",
                (true, true) => b"dcr",
            });
            argv.push_u64(m.retention.max_len);
            argv.push_u64(max_age_ms(m.retention));
            argv.push(m.frame.head());
            argv.push(m.id.as_bytes());
            argv.push(m.frame.tail());
        }
        if let Some(d) = m.dedup {
            push_receipt(argv, d);
        }
    }

    /// The run as one `EVALSHA` of `APPEND` (its keys, then its arguments).
    pub fn command(self) -> redis::Cmd {
        debug_assert!(self.messages.is_some_and(|n| n > 0), "a channel, and a message for each");
        evalsha(super::APPEND.get_hash(), &self.keys, &self.argv)
    }
}

/// A `VOLATILE` run: volatile messages without a receipt, of one or more
/// channels (on a cluster, one), a channel's messages one after another,
/// written straight into one `EVALSHA` as [`AppendRun`] is.
pub(crate) struct VolatileRun {
    keys: ArgBuf,
    argv: ArgBuf,
}

impl VolatileRun {
    pub fn begin(publish: &'static str) -> Self {
        let mut argv = ArgBuf::default();
        argv.push(publish.as_bytes());
        Self { keys: ArgBuf::default(), argv }
    }

    /// The next message: its channel's meta key, then its channel, fan-out
    /// channel, id and the frame around its ts.
    pub fn message(&mut self, keys: &Keys, channel: &ChannelName, frame: &FrameTemplate, id: &str) {
        self.keys.push_with(|out| keys.write_channel_key(out, channel, "meta"));
        let argv = &mut self.argv;
        argv.push(channel.as_str().as_bytes());
        argv.push_with(|out| keys.write_channel_key(out, channel, "fan"));
        argv.push(id.as_bytes());
        argv.push(frame.head());
        argv.push(frame.tail());
    }

    /// The run as one `EVALSHA` of `VOLATILE`.
    pub fn command(self) -> redis::Cmd {
        debug_assert!(self.keys.len() > 0, "a message");
        evalsha(super::VOLATILE.get_hash(), &self.keys, &self.argv)
    }
}

#[cfg(test)]
impl ScriptHeader for VolatileRun {
    const SOURCE: &'static str = include_str!("volatile.lua");

    fn keys() -> Vec<String> {
        vec!["meta...".to_owned()]
    }

    fn argv() -> Vec<String> {
        vec!["publish".to_owned(), "(channel,fan,id,head,tail)...".to_owned()]
    }
}

/// One `EVALSHA` of the script `hash` with these keys and arguments,
/// copied into the command once.
fn evalsha(hash: &str, keys: &ArgBuf, argv: &ArgBuf) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(
        3 + keys.len() + argv.len(),
        16 + hash.len() + keys.data.len() + argv.data.len(),
    );
    cmd.arg("EVALSHA").arg(hash).arg(keys.len());
    for k in keys.iter() {
        cmd.arg(k);
    }
    for a in argv.iter() {
        cmd.arg(a);
    }
    cmd
}

script_args! {
    /// `READ`: the position and a page of the log. `epoch`: a fresh one,
    /// used if the channel has none.
    Read => READ, "read.lua" {
        keys { meta: String, log: String }
        argv { epoch: String, after: u64, limit: usize }
    }

    /// `CHECK`: epoch, head and the id at `seq`.
    Check => CHECK, "check.lua" {
        keys { meta: String, log: String }
        argv { seq: u64 }
    }

    /// `BUMP_EPOCH`: a new epoch if the channel is still in `expected`.
    BumpEpoch<'a> => BUMP_EPOCH, "bump_epoch.lua" {
        keys { meta: String }
        argv { expected: &'a str, new: &'a str }
    }

    /// `ACK`: compare-and-raise of a cursor.
    /// `indexed`: the subscriber's user-index entry is known to be written.
    Ack<'a> => ACK, "ack.lua" {
        keys { meta: String, cursors: String }
        argv { subscriber: &'a str, seq: u64, indexed: bool }
    }

    /// `LEASE`: keep the node's lease.
    NodeLeaseKeep<'a> => LEASE, "lease.lua" {
        keys { lease: &'a str }
        argv { token: &'a str, ttl_ms: u64 }
    }

    /// `LEASE_RELEASE`: remove the node's lease if it is ours.
    NodeLeaseRelease<'a> => LEASE_RELEASE, "lease_release.lua" {
        keys { lease: &'a str }
        argv { token: &'a str }
    }

    /// `OWN_CLAIM`: claim an exclusive work lease.
    OwnClaim<'a> => OWN_CLAIM, "own_claim.lua" {
        keys { owner: String, counter: String }
        argv { holder: &'a str, ttl_ms: u64 }
    }

    /// `OWN_RELEASE`: give a work lease up.
    OwnRelease<'a> => OWN_RELEASE, "own_release.lua" {
        keys { owner: String }
        argv { holder: &'a str }
    }

    /// `PRESENCE_JOIN`. `member`: the member as JSON.
    PresenceJoin<'a> => PRESENCE_JOIN, "presence_join.lua" {
        keys { meta: String, presence: String, presence_exp: String, presence_keys: String, presence_token: String }
        argv { member_key: &'a str, member: &'a str, ttl_ms: u64 }
    }

    /// `PRESENCE_RENEW`.
    PresenceRenew<'a> => PRESENCE_RENEW, "presence_renew.lua" {
        keys { presence: String, presence_exp: String }
        argv { member_key: &'a str, token: u64, ttl_ms: u64 }
    }

    /// `PRESENCE_LEAVE`.
    PresenceLeave<'a> => PRESENCE_LEAVE, "presence_leave.lua" {
        keys {
            leases: LeaseKeys,
            meta: String,
        }
        argv { member_key: &'a str, token: u64 }
    }

    /// `PRESENCE_REJOIN`.
    PresenceRejoin<'a> => PRESENCE_REJOIN, "presence_rejoin.lua" {
        keys {
            meta: String,
            leases: LeaseKeys,
        }
        argv { member_key: &'a str, member: &'a str, token: u64, ttl_ms: u64 }
    }

    /// `PRESENCE_LIST`.
    PresenceList => PRESENCE_LIST, "presence_list.lua" {
        keys { presence: String, presence_exp: String, presence_keys: String }
        argv { limit: usize }
    }

    /// `PRESENCE_COUNT`.
    PresenceCount => PRESENCE_COUNT, "presence_count.lua" {
        keys { presence_exp: String }
        argv {}
    }

    /// `PRESENCE_HAS_USER`. `user_prefix`: the start of every member key of
    /// the user (`{len}:{user}`).
    PresenceHasUser<'a> => PRESENCE_HAS_USER, "presence_has_user.lua" {
        keys { presence_exp: String, presence_keys: String }
        argv { user_prefix: &'a str }
    }

    /// `PRESENCE_SWEEP`.
    PresenceSweep => PRESENCE_SWEEP, "presence_sweep.lua" {
        keys {
            leases: LeaseKeys,
        }
        argv { limit: usize }
    }

    /// `INDEX_LOWER`: lower a channel's sweep-index score to `score`, or
    /// (none) to now + `ttl_ms`.
    IndexLower<'a> => INDEX_LOWER, "index_lower.lua" {
        keys { due: String }
        argv { channel: &'a str, score: OrEmpty<u64>, ttl_ms: u64 }
    }

    /// `INDEX_CLAIM`: claim due channels.
    IndexClaim => INDEX_CLAIM, "index_claim.lua" {
        keys { due: String }
        argv { n: usize, claim_ms: u64 }
    }

    /// `INDEX_SETTLE`: settle a claim (the claim's score) with the next
    /// score, or `''` to remove the channel.
    IndexSettle<'a> => INDEX_SETTLE, "index_settle.lua" {
        keys { due: String }
        argv { channel: &'a str, claim: &'a str, next: &'a str }
    }

    /// `ROOM_WRITE`. `expected_version`: none to create the room.
    RoomWrite<'a> => ROOM_WRITE, "room_write.lua" {
        keys {
            meta: String,
            log: String,
            room: String,
            leases: LeaseKeys,
        }
        argv { expected_version: OrEmpty<u64>, version: u64, record: &'a str, closing: bool }
        then event: Event<'a>
    }

    /// `SCHED_ADD`. `receipt` (dedup) and `fingerprint` (hex; empty
    /// without dedup) go together.
    SchedAdd<'a> => SCHED_ADD, "sched_add.lua" {
        keys { sched: String, sched_idx: String, receipt: Option<String> }
        argv { id: &'a str, deliver_at: u64, record: &'a [u8], fingerprint: String, receipt_ttl_ms: u64 }
    }

    /// `SCHED_CLAIM`.
    SchedClaim<'a> => SCHED_CLAIM, "sched_claim.lua" {
        keys { sched: String, claims: String }
        argv { id: &'a str, lease_ms: u64 }
    }

    /// `SCHED_DELIVER`.
    SchedDeliver<'a> => SCHED_DELIVER, "sched_deliver.lua" {
        keys { meta: String, log: String, sched: String, sched_idx: String, claims: String }
        argv { id: &'a str, token: u64, durable: bool }
        then event: Event<'a>
    }

    /// `SCHED_CANCEL`.
    SchedCancel<'a> => SCHED_CANCEL, "sched_cancel.lua" {
        keys { sched: String, sched_idx: String, claims: String }
        argv { id: &'a str }
    }
}
