//! The Lua scripts: one `.lua` file each beside this module, assembled
//! here with the helpers they share (`helpers.lua`; `gone.lua` for the
//! presence scripts that remember removed leases), and their argument
//! structs (`args.rs`). Each `.lua` file starts with a header naming its
//! `KEYS` and `ARGV` in order, which a unit test (`tests.rs`) checks
//! against its struct.
//!
//! Each script touches the keys of one channel only (one hash slot),
//! declares them all in `KEYS`, and validates its arguments before its
//! first write (Lua does not roll back: a script that fails half way keeps
//! what it wrote). They start with `#!lua` (no flags), so Redis refuses
//! them up front when it is out of memory instead of failing between two
//! writes.
//!
//! Numbers: Lua numbers are doubles, exact up to 2^53; seqs and ms
//! timestamps stay far below. They are formatted with `%d`, never `..`
//! (which would switch to exponent notation past 14 digits).

use std::sync::LazyLock;

use redis::Script;

mod args;
#[cfg(test)]
mod tests;

pub(crate) use args::*;

/// Shared helpers, pasted after the shebang of each script.
const HELPERS: &str = include_str!("helpers.lua");

/// `#!lua` (no flags): Redis refuses the script up front when it is out of
/// memory instead of failing between two writes.
const WRITES: &str = "#!lua\n";
/// `#!lua flags=no-writes`: a script that writes nothing (`TIME` and reads
/// only).
const NO_WRITES: &str = "#!lua flags=no-writes\n";

/// A script with the shared helpers.
fn script(body: &str) -> Script {
    Script::new(&format!("{WRITES}\n{HELPERS}\n\n{body}"))
}

/// A script that also keeps the channel's removed leases
/// (`presence:gone`, `presence:gone:exp`) for rejoins (`gone.lua`):
/// each member's last removal, its token and whether its holder left (`l`)
/// or was swept (`s`), forgotten after `GONE_MEMORY`, at most `GONE_CAP`
/// per channel.
fn gone_script(body: &str) -> Script {
    script(&format!("{}\n{body}", gone_text()))
}

/// `gone.lua` with its placeholders filled in.
fn gone_text() -> String {
    include_str!("gone.lua")
        .replace("${GONE_MEMORY_MS}", &herald_core::GONE_MEMORY.as_millis().to_string())
        .replace("${GONE_CAP}", &herald_core::GONE_CAP.to_string())
}

/// A script with the shared helpers that writes nothing.
fn read_only(body: &str) -> Script {
    Script::new(&format!("{NO_WRITES}\n{HELPERS}\n\n{body}"))
}

/// A script without the helpers.
fn bare(shebang: &str, body: &str) -> Script {
    Script::new(&format!("{shebang}{body}"))
}

/// Append (durable or volatile) the messages of one or more channels, each
/// with dedup, atomically and in the order given: a batch's part for these
/// channels (`Log::append_batch`), one script run whatever the batch's
/// size. Several channels share a run only on a single instance (on a
/// cluster a script's keys must share a slot).
///
/// Arguments: [`Append`], then per channel an [`AppendChannel`] followed by
/// an [`AppendMessage`] per message.
///
/// Returns one bulk string: a line per message, in order (the channels in
/// order, each channel's messages in order), so the node reads one value
/// however many messages the run holds: `ok <seq|-> <ts> <epoch|-> <lost
/// 0|1>`, `dup <seq|-> <id> <ts> <epoch|->`, `mismatch`, `closed` (the
/// channel is closed; checked after the receipt, so a retry of an append
/// made before the close still gets its receipt) or `err <message>` (this
/// message was not appended; the next ones are still tried, as separate
/// appends would be). Every argument is checked before the first write:
/// one bad message refuses the whole call with an error reply and writes
/// nothing. Redis's clock is read once per run.
///
/// Each message is handled exactly as it would be alone: its receipt is
/// read after the messages before it were appended, so a key used twice in
/// one call is a duplicate (or a mismatch) the second time.
///
/// The fan-out is published from inside the script: Redis runs scripts of
/// one slot one at a time, so the pub/sub order of a channel is its seq
/// order, and no crash of a node between append and publish can lose it.
/// Redis sends it to subscribers only after the write reached the AOF
/// (under `appendfsync always`, after the fsync), like the reply. The
/// payload is `v2 <channel> <seq|-> <ts> <id> <epoch|-> <closes 0|1>\n<frame>`.
pub(crate) static APPEND: LazyLock<Script> = LazyLock::new(|| script(include_str!("append.lua")));

/// Publish a run of volatile messages without a receipt, of one or more
/// channels, in the order given: `APPEND`'s volatile path without what
/// such a message does not need (no log, no receipt), so Redis reads five
/// arguments and one key a message and a channel's meta once for its
/// messages in the run. Each message is what `APPEND` would make of it:
/// the same checks (refused when its channel is closed), the same
/// payload on the fan-out channel, the same line in the reply (`ok - <ts>
/// <epoch|-> 0` or `closed`). Every argument is checked before the first
/// publish.
///
/// Arguments: [`VolatileRun`].
pub(crate) static VOLATILE: LazyLock<Script> = LazyLock::new(|| script(include_str!("volatile.lua")));

/// Position and (with `limit > 0`) a page of the log, in one snapshot.
///
/// Arguments: [`Read`]. Returns `{epoch, head, first, lost, entries, closed}`,
/// entries as XRANGE gives them, seqs `after+1 ..= head`; closed is 1 when
/// the channel is closed (its head is its last message).
pub(crate) static READ: LazyLock<Script> = LazyLock::new(|| script(include_str!("read.lua")));

/// The fan-out's cheap periodic check: the channel's epoch and head, and
/// the id of the message at `seq` (to notice a log rewritten under the same
/// epoch). Writes nothing.
///
/// Arguments: [`Check`]. Returns `{epoch|'', head, id|''}`.
pub(crate) static CHECK: LazyLock<Script> = LazyLock::new(|| bare(NO_WRITES, include_str!("check.lua")));

/// Start a new epoch if the channel is still in `expected` (compare and
/// set: of several nodes noticing the same loss, one starts the epoch).
///
/// Arguments: [`BumpEpoch`]. Returns `{1, new}` or `{0, current|''}`.
pub(crate) static BUMP_EPOCH: LazyLock<Script> =
    LazyLock::new(|| bare(WRITES, include_str!("bump_epoch.lua")));

/// Compare-and-raise of a cursor; refuses a seq beyond the head.
///
/// Arguments: [`Ack`]. Returns `{'ok', seq, acked_at_ms}`,
/// `{'beyond', head}`, or `{'index'}` when the cursor does not exist yet and
/// the index entry must be written first (it lives in another slot).
pub(crate) static ACK: LazyLock<Script> = LazyLock::new(|| script(include_str!("ack.lua")));

/// Keep the node's lease: refresh it if it is ours, take it (back) if it is
/// gone or someone else's.
///
/// Arguments: [`NodeLeaseKeep`]. Returns 0 (refreshed), 1 (was
/// gone, re-registered) or 2 (held by another token, taken over).
pub(crate) static LEASE: LazyLock<Script> = LazyLock::new(|| bare(WRITES, include_str!("lease.lua")));

/// Claim an exclusive work lease (`herald_core::Ownership`): renew it if
/// `holder` holds it, take it if it is gone, else refuse. Every take-over
/// gets the next value of the key's token counter, which never expires, so
/// tokens only grow. Timed by Redis's clock (`PX`).
///
/// Arguments: [`OwnClaim`]. Returns the token, or
/// -1 when another holder's lease has not expired.
pub(crate) static OWN_CLAIM: LazyLock<Script> = LazyLock::new(|| bare(WRITES, include_str!("own_claim.lua")));

/// Give a work lease up if `holder` holds it.
///
/// Arguments: [`OwnRelease`]. Returns 1 when removed.
pub(crate) static OWN_RELEASE: LazyLock<Script> =
    LazyLock::new(|| bare(WRITES, include_str!("own_release.lua")));

/// Remove the node's lease if it is still ours (a clean shutdown). No
/// shebang: a `DEL` is allowed even when Redis is out of memory.
///
/// Arguments: [`NodeLeaseRelease`]. Returns 1 when removed.
pub(crate) static LEASE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lease_release.lua")));

// ---- Presence ----
//
// A lease is a field of the channel's presence hash, `<token>
// <expires_at_ms> <member JSON>`, with an entry in the expiry set (scored
// by expires_at_ms) and one in the key set (score 0, for key order and a
// user's leases by prefix). The three always change together, in one
// script. Times are Redis's (`TIME`), so leases expire on time whichever
// node wrote them.

/// Join: a new lease, or take over the stored one (expired or not) with a
/// new token.
///
/// Arguments: [`PresenceJoin`]. Returns `{'new'|'reclaimed', token,
/// expires_at}` or `{'closed'}`.
pub(crate) static PRESENCE_JOIN: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("presence_join.lua")));

/// Renew: extend the lease if it holds `token`; never creates one.
///
/// Arguments: [`PresenceRenew`]. Returns
/// `{'until', expires_at}`, `{'superseded'}` or `{'gone'}`.
pub(crate) static PRESENCE_RENEW: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("presence_renew.lua")));

/// Leave: remove the lease if it holds `token`, and remember that its
/// holder left (also when the lease was swept already), so no rejoin with
/// `token` brings it back.
///
/// Arguments: [`PresenceLeave`]. Returns `{'left', lease}` or `{'none'}`.
pub(crate) static PRESENCE_LEAVE: LazyLock<Script> =
    LazyLock::new(|| gone_script(include_str!("presence_leave.lua")));

/// Rejoin: bring back a removed lease for the holder of its token, unless
/// anything newer happened to the member (see `Presence::presence_rejoin`).
///
/// Arguments: [`PresenceRejoin`]. Returns `{'back', expires_at}`, `{'held', expires_at}`, `{'fenced'}` or
/// `{'closed'}`.
pub(crate) static PRESENCE_REJOIN: LazyLock<Script> =
    LazyLock::new(|| gone_script(include_str!("presence_rejoin.lua")));

/// Up to `limit` unexpired leases, in key order. Writes nothing.
///
/// Arguments: [`PresenceList`]. Returns the lease records.
pub(crate) static PRESENCE_LIST: LazyLock<Script> =
    LazyLock::new(|| read_only(include_str!("presence_list.lua")));

/// How many unexpired leases. Arguments: [`PresenceCount`].
pub(crate) static PRESENCE_COUNT: LazyLock<Script> =
    LazyLock::new(|| read_only(include_str!("presence_count.lua")));

/// Whether a user holds an unexpired lease: its leases are the member keys
/// starting with `{len}:{user}` (no other user's key does), a lex range.
///
/// Arguments: [`PresenceHasUser`]. Returns 1 or 0.
pub(crate) static PRESENCE_HAS_USER: LazyLock<Script> =
    LazyLock::new(|| read_only(include_str!("presence_has_user.lua")));

/// Remove up to `limit` expired leases of one channel and return them
/// (each to exactly one caller: the removal is in the same step), with the
/// earliest expiry left.
///
/// Arguments: [`PresenceSweep`]. Returns `{next expires_at | '', {lease
/// records}}`.
pub(crate) static PRESENCE_SWEEP: LazyLock<Script> =
    LazyLock::new(|| gone_script(include_str!("presence_sweep.lua")));

// ---- The sweep index (`presence:due`, its own slot) ----
//
// A channel's score is when it should be swept next: at or before the
// earliest expiry of its leases. Integer scores are times (ms); a score
// with `.5` is a sweeper's claim (see `presence.rs`).

/// Lower the channel's score to `score` (or now + `ttl`), adding it if
/// absent; a claim is replaced (its sweeper's settle then does nothing).
///
/// Arguments: [`IndexLower`]. Returns 1 if written.
pub(crate) static INDEX_LOWER: LazyLock<Script> = LazyLock::new(|| script(include_str!("index_lower.lua")));

/// Claim up to `n` channels that are due: their score becomes now + claim
/// ms + 0.5, so no other sweeper takes them until the claim runs out.
///
/// Arguments: [`IndexClaim`]. Returns `{claim score | '',
/// {channels}}`.
pub(crate) static INDEX_CLAIM: LazyLock<Script> = LazyLock::new(|| script(include_str!("index_claim.lua")));

/// Settle a claim: if the channel still has our claim score, set its next
/// sweep time, or remove it (no lease left). Anything else means a join
/// wrote it meanwhile, and its score stands.
///
/// Arguments: [`IndexSettle`]. Returns 1 if settled.
pub(crate) static INDEX_SETTLE: LazyLock<Script> = LazyLock::new(|| script(include_str!("index_settle.lua")));

// ---- Rooms ----

/// Compare-and-set of a room's record plus the append of its event, as
/// one step; closing also closes the channel and removes every lease.
///
/// Arguments: [`RoomWrite`] (the event's last, an [`Event`]). Returns `{'ok', seq, ts, epoch, lost}`, `{'conflict', record | ''}` or
/// `{'closed'}` (the version matched but the channel is closed).
pub(crate) static ROOM_WRITE: LazyLock<Script> = LazyLock::new(|| script(include_str!("room_write.lua")));

/// Store a schedule (scheduled delivery), with its dedup receipt.
///
/// Arguments: [`SchedAdd`]. Returns `{'ok'}`, `{'dup', id, deliver_at}` or `{'mismatch'}`.
pub(crate) static SCHED_ADD: LazyLock<Script> = LazyLock::new(|| script(include_str!("sched_add.lua")));

/// Claim a schedule: a lease with a fencing token that only grows.
///
/// Arguments: [`SchedClaim`]. Returns `{'ok', token, record}`, `{'held'}` (under an unexpired
/// claim) or `{'missing'}` (delivered or cancelled).
pub(crate) static SCHED_CLAIM: LazyLock<Script> = LazyLock::new(|| script(include_str!("sched_claim.lua")));

/// Deliver a claimed schedule: the append (as APPEND does it, without
/// dedup) and the removal of the schedule, in one step, only while the
/// schedule is stored and the claim's token is its latest.
///
/// Arguments: [`SchedDeliver`] (the message's last, an [`Event`]). Returns `{'ok', seq|'-', ts, epoch|'-',
/// lost}`, `{'stale'}` or `{'closed'}`.
pub(crate) static SCHED_DELIVER: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("sched_deliver.lua")));

/// Cancel a schedule. Arguments: [`SchedCancel`]. Returns the record, or
/// nil when there is none.
pub(crate) static SCHED_CANCEL: LazyLock<Script> = LazyLock::new(|| script(include_str!("sched_cancel.lua")));
