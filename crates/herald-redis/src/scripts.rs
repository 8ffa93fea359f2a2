//! The Lua scripts. Each one touches the keys of one channel only (one hash
//! slot), declares them all in `KEYS`, and validates its arguments before
//! its first write (Lua does not roll back: a script that fails half way
//! keeps what it wrote). They start with `#!lua` (no flags), so Redis
//! refuses them up front when it is out of memory instead of failing
//! between two writes.
//!
//! Numbers: Lua numbers are doubles, exact up to 2^53; seqs and ms
//! timestamps stay far below. They are formatted with `%d`, never `..`
//! (which would switch to exponent notation past 14 digits).

use std::sync::LazyLock;

use redis::Script;

/// Shared helpers, pasted after the shebang of each script.
const HELPERS: &str = r#"
local function fmt(n) return string.format('%d', n) end
local function ms_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function seq_of(id) return tonumber(string.match(id, '^(%d+)%-')) end
-- The last seq the stream ever held (its last generated id); nil without a stream.
local function stream_last(log)
  if redis.call('EXISTS', log) == 0 then return nil end
  local info = redis.call('XINFO', 'STREAM', log)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then return seq_of(info[i + 1]) end
  end
  return nil
end
-- The channel's epoch and head. Creates the meta of a channel never seen,
-- in a new epoch. lost = 1 when the meta was missing but the stream was
-- not: Redis lost the meta; the log goes on after its last seq, in a new
-- epoch, so clients holding old seqs resync.
local function ensure_meta(meta, log, new_epoch)
  local m = redis.call('HMGET', meta, 'epoch', 'seq')
  if m[1] then return m[1], tonumber(m[2] or '0'), 0 end
  local head, lost = 0, 0
  local last = stream_last(log)
  if last then head, lost = last, 1 end
  redis.call('HSET', meta, 'epoch', new_epoch, 'seq', fmt(head))
  return new_epoch, head, lost
end
local function first_of(log, head)
  local f = redis.call('XRANGE', log, '-', '+', 'COUNT', 1)
  if f[1] then return seq_of(f[1][1]) end
  return head + 1
end
local function is_closed(meta) return redis.call('HGET', meta, 'closed') == '1' end
-- Append one message to the channel and publish it on its fan-out channel:
-- the common part of APPEND and ROOM_WRITE. `a` holds durable, closes,
-- epoch (a fresh one, used if the channel has none), max_len, max_age,
-- the frame's head, middle and tail, id, channel, fan, publish. Returns
-- {sseq, ts, sepoch, lost}, or {err = <error reply>} before any write of
-- its own but ensure_meta's.
local function append_msg(meta, log, a)
  local ts = ms_now()
  local epoch, seq, lost, frame = '', nil, 0, nil
  if a.durable then
    local head
    epoch, head, lost = ensure_meta(meta, log, a.epoch)
    local last_ts = tonumber(redis.call('HGET', meta, 'ts') or '0')
    if last_ts > ts then ts = last_ts end
    seq = head + 1
    local function xadd()
      frame = a.head .. fmt(seq) .. a.middle .. fmt(ts) .. a.tail
      if a.max_len > 0 then
        return redis.pcall('XADD', log, 'MAXLEN', '=', fmt(a.max_len), fmt(seq) .. '-0',
          't', fmt(ts), 'i', a.id, 'f', frame)
      end
      return redis.pcall('XADD', log, fmt(seq) .. '-0', 't', fmt(ts), 'i', a.id, 'f', frame)
    end
    local added = xadd()
    if type(added) == 'table' and added.err then
      -- The stream is ahead of the meta (Redis lost part of the meta): go on
      -- after the stream's last seq, in a new epoch.
      local last = stream_last(log)
      if not last or last < seq then return {err = added} end
      seq, epoch, lost = last + 1, a.epoch, 1
      added = xadd()
      if type(added) == 'table' and added.err then return {err = added} end
    end
    redis.call('HSET', meta, 'epoch', epoch, 'seq', fmt(seq), 'ts', fmt(ts))
    if a.closes then redis.call('HSET', meta, 'closed', '1') end
    if a.max_age > 0 then
      -- Messages older than max_age go. The log is ordered by ts and
      -- gap-free, so a binary search finds the first one to keep; the
      -- message just added is always kept.
      local cutoff = ts - a.max_age
      local function ts_of(s)
        local e = redis.call('XRANGE', log, fmt(s) .. '-0', fmt(s) .. '-0')
        if e[1] then return tonumber(e[1][2][2]) end
        return -1
      end
      local f = redis.call('XRANGE', log, '-', '+', 'COUNT', 1)
      if f[1] and tonumber(f[1][2][2]) < cutoff then
        local lo, hi = seq_of(f[1][1]), seq
        while hi - lo > 1 do
          local mid = math.floor((lo + hi) / 2)
          if ts_of(mid) < cutoff then lo = mid else hi = mid end
        end
        redis.call('XTRIM', log, 'MINID', fmt(hi) .. '-0')
      end
      -- A channel idle for max_age has nothing left to keep.
      redis.call('PEXPIRE', log, fmt(a.max_age))
    else
      redis.call('PERSIST', log)
    end
  else
    epoch = redis.call('HGET', meta, 'epoch') or ''
    frame = a.head .. a.middle .. fmt(ts) .. a.tail
  end
  local sseq = '-'
  if seq then sseq = fmt(seq) end
  local sepoch = epoch
  if sepoch == '' then sepoch = '-' end
  local closes = '0'
  if seq and a.closes then closes = '1' end
  redis.call(a.publish, a.fan, 'v2 ' .. a.channel .. ' ' .. sseq .. ' ' .. fmt(ts) .. ' ' .. a.id .. ' '
    .. sepoch .. ' ' .. closes .. '\n' .. frame)
  return {sseq = sseq, ts = ts, sepoch = sepoch, lost = lost}
end
"#;

fn script(body: &str) -> Script {
    Script::new(&format!("#!lua\n{HELPERS}\n{body}"))
}

/// A presence script that also keeps the channel's removed leases
/// (`presence:gone`, `presence:gone:exp`) for rejoins: each member's last
/// removal, its token and whether its holder left (`l`) or was swept (`s`),
/// forgotten after `GONE_MEMORY`, at most `GONE_CAP` per channel.
fn gone_script(body: &str) -> Script {
    let memory_ms = herald_core::GONE_MEMORY.as_millis();
    let cap = herald_core::GONE_CAP;
    script(&format!(
        r#"
local function gone_prune(gone, gone_exp, now)
  local due = redis.call('ZRANGEBYSCORE', gone_exp, '-inf', fmt(now), 'LIMIT', 0, 64)
  if #due > 0 then
    redis.call('HDEL', gone, unpack(due))
    redis.call('ZREM', gone_exp, unpack(due))
  end
end
-- Remember that key's lease with token was removed (left: by a leave with
-- it). A removal remembered with a greater token stays; a leave stays.
local function gone_note(gone, gone_exp, key, token, left, now)
  gone_prune(gone, gone_exp, now)
  local cur = redis.call('HGET', gone, key)
  if cur then
    local t, how = string.match(cur, '^(%d+) (%a)$')
    if t and tonumber(t) > tonumber(token) then return end
    if t == token and how == 'l' then left = true end
  end
  local how = 's'
  if left then how = 'l' end
  redis.call('HSET', gone, key, token .. ' ' .. how)
  redis.call('ZADD', gone_exp, fmt(now + {memory_ms}), key)
  local n = redis.call('ZCARD', gone_exp)
  if n > {cap} then
    local old = redis.call('ZRANGE', gone_exp, 0, n - {cap} - 1)
    redis.call('HDEL', gone, unpack(old))
    redis.call('ZREM', gone_exp, unpack(old))
  end
end
{body}"#
    ))
}

/// A script that writes nothing (`TIME` and reads only).
fn read_only(body: &str) -> Script {
    Script::new(&format!("#!lua flags=no-writes\n{HELPERS}\n{body}"))
}

/// The fields of one message in [`APPEND`]'s arguments.
pub(crate) const APPEND_FIELDS: usize = 11;

/// Append (durable or volatile) one or more messages of one channel, each
/// with dedup, atomically and in the order given: the one submission of a
/// batch for this channel (`Log::append_batch`), one script run whatever
/// the batch's size.
///
/// KEYS: meta, log, then the receipt keys of the messages that have one.
/// ARGV: a fresh epoch (used if the channel has none), channel, fan-out
/// pub/sub channel, `PUBLISH` or `SPUBLISH`, then [`APPEND_FIELDS`] per
/// message: durable (`1`/`0`), max_len, max_age_ms, fingerprint (hex),
/// receipt ttl ms, frame head, frame middle, frame tail, message id, closes
/// (`1`/`0`: durable only, the channel's last message), the index in KEYS
/// of its receipt key (`0`: no dedup).
///
/// Returns one reply per message, in order: `{'ok', seq|'-', ts, epoch|'-',
/// lost}`, `{'dup', seq|'-', id, ts, epoch|'-'}`, `{'mismatch'}`,
/// `{'closed'}` (the channel is closed; checked after the receipt, so a
/// retry of an append made before the close still gets its receipt) or
/// `{'err', message}` (this message was not appended; the next ones are
/// still tried, as separate appends would be). Every message's arguments
/// are checked before the first write: one bad message refuses the whole
/// call with an error reply and writes nothing.
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
pub(crate) static APPEND: LazyLock<Script> = LazyLock::new(|| {
    script(&format!(
        r#"
local F = {APPEND_FIELDS}
local n = (#ARGV - 4) / F
if n < 1 or n ~= math.floor(n) or (ARGV[4] ~= 'PUBLISH' and ARGV[4] ~= 'SPUBLISH') or ARGV[2] == '' then
  return redis.error_reply('ERR herald append: bad arguments')
end
local msgs = {{}}
for i = 1, n do
  local b = 4 + (i - 1) * F
  local max_len, max_age, ttl, rk = tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 5]),
    tonumber(ARGV[b + 11])
  if not (max_len and max_age and ttl and rk) or max_len < 0 or max_age < 0 or ttl <= 0
     or (ARGV[b + 1] ~= '1' and ARGV[b + 1] ~= '0') or ARGV[b + 9] == ''
     or (ARGV[b + 10] ~= '1' and ARGV[b + 10] ~= '0')
     or (rk ~= 0 and (rk < 3 or rk > #KEYS)) then
    return redis.error_reply('ERR herald append: bad arguments')
  end
  local durable = ARGV[b + 1] == '1'
  msgs[i] = {{
    receipt = rk > 0 and KEYS[rk] or nil, fp = ARGV[b + 4], ttl = ttl,
    a = {{
      durable = durable, closes = durable and ARGV[b + 10] == '1', epoch = ARGV[1], max_len = max_len,
      max_age = max_age, head = ARGV[b + 6], middle = ARGV[b + 7], tail = ARGV[b + 8], id = ARGV[b + 9],
      channel = ARGV[2], fan = ARGV[3], publish = ARGV[4],
    }},
  }}
end
local meta, log = KEYS[1], KEYS[2]
local out = {{}}
for i, m in ipairs(msgs) do
  local reply
  local r = m.receipt and redis.call('GET', m.receipt)
  if r then
    local fp, seq, id, ts, epoch = string.match(r, '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
    if not fp then
      reply = {{'err', 'malformed receipt'}}
    elseif fp ~= m.fp then
      reply = {{'mismatch'}}
    else
      reply = {{'dup', seq, id, ts, epoch}}
    end
  elseif is_closed(meta) then
    reply = {{'closed'}}
  else
    local a = append_msg(meta, log, m.a)
    if a.err then
      reply = {{'err', tostring(a.err.err or a.err)}}
    else
      if m.receipt then
        redis.call('SET', m.receipt, m.fp .. ' ' .. a.sseq .. ' ' .. m.a.id .. ' ' .. fmt(a.ts) .. ' '
          .. a.sepoch, 'PX', fmt(m.ttl))
      end
      reply = {{'ok', a.sseq, fmt(a.ts), a.sepoch, a.lost}}
    end
  end
  out[i] = reply
end
return out
"#
    ))
});

/// Position and (with `limit > 0`) a page of the log, in one snapshot.
///
/// KEYS: meta, log. ARGV: a fresh epoch (used if the channel has none),
/// after, limit. Returns `{epoch, head, first, lost, entries, closed}`,
/// entries as XRANGE gives them, seqs `after+1 ..= head`; closed is 1 when
/// the channel is closed (its head is its last message).
pub(crate) static READ: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local after, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
if not (after and limit) or after < 0 or limit < 0 then
  return redis.error_reply('ERR herald read: bad arguments')
end
local epoch, head, lost = ensure_meta(KEYS[1], KEYS[2], ARGV[1])
local first = first_of(KEYS[2], head)
local entries = {}
if limit > 0 and after < head then
  entries = redis.call('XRANGE', KEYS[2], fmt(after + 1) .. '-0', fmt(head) .. '-0', 'COUNT', fmt(limit))
end
local closed = 0
if is_closed(KEYS[1]) then closed = 1 end
return {epoch, fmt(head), fmt(first), lost, entries, closed}
"#,
    )
});

/// The fan-out's cheap periodic check: the channel's epoch and head, and
/// the id of the message at `seq` (to notice a log rewritten under the same
/// epoch). Writes nothing.
///
/// KEYS: meta, log. ARGV: seq. Returns `{epoch|'', head, id|''}`.
pub(crate) static CHECK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"#!lua flags=no-writes
local m = redis.call('HMGET', KEYS[1], 'epoch', 'seq')
local id = ''
local s = tonumber(ARGV[1])
if s and s > 0 then
  local e = redis.call('XRANGE', KEYS[2], ARGV[1] .. '-0', ARGV[1] .. '-0')
  if e[1] then id = e[1][2][4] end
end
return {m[1] or '', m[2] or '0', id}
"#,
    )
});

/// Start a new epoch if the channel is still in `expected` (compare and
/// set: of several nodes noticing the same loss, one starts the epoch).
///
/// KEYS: meta. ARGV: expected epoch, new epoch. Returns `{1, new}` or `{0,
/// current|''}`.
pub(crate) static BUMP_EPOCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"#!lua
local cur = redis.call('HGET', KEYS[1], 'epoch')
if cur and cur == ARGV[1] then
  redis.call('HSET', KEYS[1], 'epoch', ARGV[2])
  return {1, ARGV[2]}
end
return {0, cur or ''}
"#,
    )
});

/// Compare-and-raise of a cursor; refuses a seq beyond the head.
///
/// KEYS: meta, cursors. ARGV: subscriber key, seq, `1` if the user index
/// entry is known to be written. Returns `{'ok', seq, acked_at_ms}`,
/// `{'beyond', head}`, or `{'index'}` when the cursor does not exist yet and
/// the index entry must be written first (it lives in another slot).
pub(crate) static ACK: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local seq = tonumber(ARGV[2])
if not seq or seq < 0 or ARGV[1] == '' then
  return redis.error_reply('ERR herald ack: bad arguments')
end
local head = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
if seq > head then return {'beyond', fmt(head)} end
local cur = redis.call('HGET', KEYS[2], ARGV[1])
local at = 0
if cur then
  local cs, ct = string.match(cur, '^(%d+):(%d+)$')
  if cs and tonumber(cs) >= seq then return {'ok', cs, ct} end
  if ct then at = tonumber(ct) end
elseif ARGV[3] ~= '1' then
  return {'index'}
end
local now = ms_now()
if at > now then now = at end
redis.call('HSET', KEYS[2], ARGV[1], fmt(seq) .. ':' .. fmt(now))
return {'ok', fmt(seq), fmt(now)}
"#,
    )
});

/// Keep the node's lease: refresh it if it is ours, take it (back) if it is
/// gone or someone else's.
///
/// KEYS: lease. ARGV: our token, ttl ms. Returns 0 (refreshed), 1 (was
/// gone, re-registered) or 2 (held by another token, taken over).
pub(crate) static LEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"#!lua
local cur = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if cur == ARGV[1] then return 0 end
if not cur then return 1 end
return 2
"#,
    )
});

/// Claim an exclusive work lease (`herald_core::Ownership`): renew it if
/// `holder` holds it, take it if it is gone, else refuse. Every take-over
/// gets the next value of the key's token counter, which never expires, so
/// tokens only grow. Timed by Redis's clock (`PX`).
///
/// KEYS: owner, token counter. ARGV: holder, ttl ms. Returns the token, or
/// -1 when another holder's lease has not expired.
pub(crate) static OWN_CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"#!lua
local cur = redis.call('GET', KEYS[1])
if cur then
  local sp = string.find(cur, ' ', 1, true)
  local token = tonumber(string.sub(cur, 1, sp - 1))
  if string.sub(cur, sp + 1) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return token
  end
  return -1
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. ' ' .. ARGV[1], 'PX', ARGV[2])
return token
"#,
    )
});

/// Give a work lease up if `holder` holds it.
///
/// KEYS: owner. ARGV: holder. Returns 1 when removed.
pub(crate) static OWN_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"#!lua
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local sp = string.find(cur, ' ', 1, true)
if string.sub(cur, sp + 1) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"#,
    )
});

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
/// KEYS: meta, presence, presence:exp, presence:keys, presence:token. ARGV:
/// member key, member JSON, ttl ms. Returns `{'new'|'reclaimed', token,
/// expires_at}` or `{'closed'}`.
pub(crate) static PRESENCE_JOIN: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local ttl = tonumber(ARGV[3])
if not ttl or ttl <= 0 or ARGV[1] == '' or ARGV[2] == '' then
  return redis.error_reply('ERR herald join: bad arguments')
end
if is_closed(KEYS[1]) then return {'closed'} end
local now = ms_now()
if redis.call('EXISTS', KEYS[5]) == 0 then
  -- A channel's counter is never deleted; missing means never used, or
  -- lost with Redis's data. Start above every token handed out before
  -- (fewer than 1000 joins per ms on the channel, on average, since its
  -- first), so a holder of a token from before the loss is still fenced.
  redis.call('SET', KEYS[5], fmt(now * 1000))
end
local token = redis.call('INCR', KEYS[5])
local exp = now + ttl
local had = redis.call('HEXISTS', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], fmt(token) .. ' ' .. fmt(exp) .. ' ' .. ARGV[2])
redis.call('ZADD', KEYS[3], fmt(exp), ARGV[1])
redis.call('ZADD', KEYS[4], 0, ARGV[1])
local kind = 'new'
if had == 1 then kind = 'reclaimed' end
return {kind, fmt(token), fmt(exp)}
"#,
    )
});

/// Renew: extend the lease if it holds `token`; never creates one.
///
/// KEYS: presence, presence:exp. ARGV: member key, token, ttl ms. Returns
/// `{'until', expires_at}`, `{'superseded'}` or `{'gone'}`.
pub(crate) static PRESENCE_RENEW: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local ttl = tonumber(ARGV[3])
if not ttl or ttl <= 0 or ARGV[1] == '' then
  return redis.error_reply('ERR herald renew: bad arguments')
end
local rec = redis.call('HGET', KEYS[1], ARGV[1])
if not rec then return {'gone'} end
local token, member = string.match(rec, '^(%d+) %d+ (.*)$')
if not token then return redis.error_reply('ERR herald renew: malformed lease') end
if token ~= ARGV[2] then return {'superseded'} end
local exp = ms_now() + ttl
redis.call('HSET', KEYS[1], ARGV[1], token .. ' ' .. fmt(exp) .. ' ' .. member)
redis.call('ZADD', KEYS[2], fmt(exp), ARGV[1])
return {'until', fmt(exp)}
"#,
    )
});

/// Leave: remove the lease if it holds `token`, and remember that its
/// holder left (also when the lease was swept already), so no rejoin with
/// `token` brings it back.
///
/// KEYS: presence, presence:exp, presence:keys, presence:gone,
/// presence:gone:exp, meta. ARGV: member key, token. Returns `{'left',
/// lease}` or `{'none'}`.
pub(crate) static PRESENCE_LEAVE: LazyLock<Script> = LazyLock::new(|| {
    gone_script(
        r#"
if ARGV[1] == '' or not string.match(ARGV[2], '^%d+$') then
  return redis.error_reply('ERR herald leave: bad arguments')
end
local rec = redis.call('HGET', KEYS[1], ARGV[1])
if rec and string.match(rec, '^(%d+) ') ~= ARGV[2] then return {'none'} end
if not rec then
  if not is_closed(KEYS[6]) then gone_note(KEYS[4], KEYS[5], ARGV[1], ARGV[2], true, ms_now()) end
  return {'none'}
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
gone_note(KEYS[4], KEYS[5], ARGV[1], ARGV[2], true, ms_now())
return {'left', rec}
"#,
    )
});

/// Rejoin: bring back a removed lease for the holder of its token, unless
/// anything newer happened to the member (see `Presence::presence_rejoin`).
///
/// KEYS: meta, presence, presence:exp, presence:keys, presence:gone,
/// presence:gone:exp. ARGV: member key, member JSON, token, ttl ms.
/// Returns `{'back', expires_at}`, `{'held', expires_at}`, `{'fenced'}` or
/// `{'closed'}`.
pub(crate) static PRESENCE_REJOIN: LazyLock<Script> = LazyLock::new(|| {
    gone_script(
        r#"
local ttl = tonumber(ARGV[4])
if not ttl or ttl <= 0 or ARGV[1] == '' or ARGV[2] == '' or not string.match(ARGV[3], '^%d+$') then
  return redis.error_reply('ERR herald rejoin: bad arguments')
end
if is_closed(KEYS[1]) then return {'closed'} end
local now = ms_now()
local exp = now + ttl
local rec = redis.call('HGET', KEYS[2], ARGV[1])
if rec then
  local token, member = string.match(rec, '^(%d+) %d+ (.*)$')
  if not token then return redis.error_reply('ERR herald rejoin: malformed lease') end
  if token ~= ARGV[3] then return {'fenced'} end
  redis.call('HSET', KEYS[2], ARGV[1], token .. ' ' .. fmt(exp) .. ' ' .. member)
  redis.call('ZADD', KEYS[3], fmt(exp), ARGV[1])
  return {'held', fmt(exp)}
end
gone_prune(KEYS[5], KEYS[6], now)
local g = redis.call('HGET', KEYS[5], ARGV[1])
if g then
  local t, how = string.match(g, '^(%d+) (%a)$')
  if t and (tonumber(t) > tonumber(ARGV[3]) or (t == ARGV[3] and how == 'l')) then return {'fenced'} end
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3] .. ' ' .. fmt(exp) .. ' ' .. ARGV[2])
redis.call('ZADD', KEYS[3], fmt(exp), ARGV[1])
redis.call('ZADD', KEYS[4], 0, ARGV[1])
return {'back', fmt(exp)}
"#,
    )
});

/// Up to `limit` unexpired leases, in key order. Writes nothing.
///
/// KEYS: presence, presence:exp, presence:keys. ARGV: limit. Returns the
/// lease records.
pub(crate) static PRESENCE_LIST: LazyLock<Script> = LazyLock::new(|| {
    read_only(
        r#"
local limit = tonumber(ARGV[1])
if not limit or limit < 0 then return redis.error_reply('ERR herald presence: bad arguments') end
local now = ms_now()
local out = {}
local from = '-'
while #out < limit do
  local ks = redis.call('ZRANGEBYLEX', KEYS[3], from, '+', 'LIMIT', 0, 256)
  if #ks == 0 then break end
  local recs = redis.call('HMGET', KEYS[1], unpack(ks))
  for i = 1, #ks do
    local r = recs[i]
    if r and #out < limit then
      local exp = tonumber(string.match(r, '^%d+ (%d+) '))
      if exp and exp > now then out[#out + 1] = r end
    end
  end
  if #ks < 256 then break end
  from = '(' .. ks[#ks]
end
return out
"#,
    )
});

/// How many unexpired leases. KEYS: presence:exp.
pub(crate) static PRESENCE_COUNT: LazyLock<Script> = LazyLock::new(|| {
    read_only(
        r#"
return redis.call('ZCOUNT', KEYS[1], '(' .. fmt(ms_now()), '+inf')
"#,
    )
});

/// Whether a user holds an unexpired lease: its leases are the member keys
/// starting with `{len}:{user}` (no other user's key does), a lex range.
///
/// KEYS: presence:exp, presence:keys. ARGV: the user's key prefix. Returns
/// 1 or 0.
pub(crate) static PRESENCE_HAS_USER: LazyLock<Script> = LazyLock::new(|| {
    read_only(
        r#"
local now = ms_now()
local from, to = '[' .. ARGV[1], '(' .. ARGV[1] .. '\255'
while true do
  local ks = redis.call('ZRANGEBYLEX', KEYS[2], from, to, 'LIMIT', 0, 64)
  for _, k in ipairs(ks) do
    local s = redis.call('ZSCORE', KEYS[1], k)
    if s and tonumber(s) > now then return 1 end
  end
  if #ks < 64 then return 0 end
  from = '(' .. ks[#ks]
end
"#,
    )
});

/// Remove up to `limit` expired leases of one channel and return them
/// (each to exactly one caller: the removal is in the same step), with the
/// earliest expiry left.
///
/// KEYS: presence, presence:exp, presence:keys, presence:gone,
/// presence:gone:exp. ARGV: limit. Returns `{next expires_at | '', {lease
/// records}}`.
pub(crate) static PRESENCE_SWEEP: LazyLock<Script> = LazyLock::new(|| {
    gone_script(
        r#"
local limit = tonumber(ARGV[1])
if not limit or limit < 1 then return redis.error_reply('ERR herald sweep: bad arguments') end
local now = ms_now()
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', fmt(now), 'LIMIT', 0, limit)
local out = {}
for _, k in ipairs(due) do
  local rec = redis.call('HGET', KEYS[1], k)
  redis.call('HDEL', KEYS[1], k)
  redis.call('ZREM', KEYS[2], k)
  redis.call('ZREM', KEYS[3], k)
  if rec then
    out[#out + 1] = rec
    local token = string.match(rec, '^(%d+) ')
    if token then gone_note(KEYS[4], KEYS[5], k, token, false, now) end
  end
end
gone_prune(KEYS[4], KEYS[5], now)
local nxt = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
return {nxt[2] or '', out}
"#,
    )
});

// ---- The sweep index (`presence:due`, its own slot) ----
//
// A channel's score is when it should be swept next: at or before the
// earliest expiry of its leases. Integer scores are times (ms); a score
// with `.5` is a sweeper's claim (see `presence.rs`).

/// Lower the channel's score to `score` (or now + `ttl`), adding it if
/// absent; a claim is replaced (its sweeper's settle then does nothing).
///
/// KEYS: presence:due. ARGV: channel, score or '', ttl ms. Returns 1 if
/// written.
pub(crate) static INDEX_LOWER: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local s = tonumber(ARGV[2])
if not s then
  local ttl = tonumber(ARGV[3])
  if not ttl then return redis.error_reply('ERR herald index: bad arguments') end
  s = ms_now() + ttl
end
local cur = redis.call('ZSCORE', KEYS[1], ARGV[1])
if cur then
  local c = tonumber(cur)
  local f = math.floor(c)
  if f < s then s = f end
  if s == c then return 0 end
end
redis.call('ZADD', KEYS[1], fmt(s), ARGV[1])
return 1
"#,
    )
});

/// Claim up to `n` channels that are due: their score becomes now + claim
/// ms + 0.5, so no other sweeper takes them until the claim runs out.
///
/// KEYS: presence:due. ARGV: n, claim ms. Returns `{claim score | '',
/// {channels}}`.
pub(crate) static INDEX_CLAIM: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local n, claim_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
if not (n and claim_ms) or n < 1 or claim_ms < 1 then
  return redis.error_reply('ERR herald claim: bad arguments')
end
local now = ms_now()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', fmt(now), 'LIMIT', 0, n)
if #due == 0 then return {'', due} end
local claim = fmt(now + claim_ms) .. '.5'
for _, ch in ipairs(due) do redis.call('ZADD', KEYS[1], claim, ch) end
return {claim, due}
"#,
    )
});

/// Settle a claim: if the channel still has our claim score, set its next
/// sweep time, or remove it (no lease left). Anything else means a join
/// wrote it meanwhile, and its score stands.
///
/// KEYS: presence:due. ARGV: channel, claim score, next score or ''.
pub(crate) static INDEX_SETTLE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local cur = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not cur or tonumber(cur) ~= tonumber(ARGV[2]) then return 0 end
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
end
return 1
"#,
    )
});

// ---- Rooms ----

/// Compare-and-set of a room's record plus the append of its event, as
/// one step; closing also closes the channel and removes every lease.
///
/// KEYS: meta, log, room, presence, presence:exp, presence:keys,
/// presence:gone, presence:gone:exp. ARGV:
/// expected version ('' = create), new version, record JSON, closing
/// (`1`/`0`), then as APPEND for the event: a fresh epoch, max_len,
/// max_age_ms, frame head, middle, tail, message id, channel, fan-out
/// channel, `PUBLISH` or `SPUBLISH`.
///
/// Returns `{'ok', seq, ts, epoch, lost}`, `{'conflict', record | ''}` or
/// `{'closed'}` (the version matched but the channel is closed).
pub(crate) static ROOM_WRITE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local max_len, max_age = tonumber(ARGV[6]), tonumber(ARGV[7])
if not (max_len and max_age and tonumber(ARGV[2])) or max_len < 0 or max_age < 0 or ARGV[3] == ''
   or (ARGV[14] ~= 'PUBLISH' and ARGV[14] ~= 'SPUBLISH') or ARGV[11] == ''
   or (ARGV[4] ~= '1' and ARGV[4] ~= '0') then
  return redis.error_reply('ERR herald room write: bad arguments')
end
local cur = redis.call('HMGET', KEYS[3], 'version', 'record')
if (ARGV[1] == '' and cur[1]) or (ARGV[1] ~= '' and cur[1] ~= ARGV[1]) then
  return {'conflict', cur[2] or ''}
end
if is_closed(KEYS[1]) then return {'closed'} end
local closing = ARGV[4] == '1'
local r = append_msg(KEYS[1], KEYS[2], {
  durable = true, closes = closing, epoch = ARGV[5], max_len = max_len, max_age = max_age,
  head = ARGV[8], middle = ARGV[9], tail = ARGV[10], id = ARGV[11], channel = ARGV[12],
  fan = ARGV[13], publish = ARGV[14],
})
if r.err then return r.err end
redis.call('HSET', KEYS[3], 'version', ARGV[2], 'record', ARGV[3])
if closing then
  -- No leave is announced for these: the final event says it all. The
  -- token counter stays.
  redis.call('DEL', KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8])
end
return {'ok', r.sseq, fmt(r.ts), r.sepoch, r.lost}
"#,
    )
});

/// Store a schedule (scheduled delivery), with its dedup receipt.
///
/// KEYS: sched (hash id → record), sched idx (sorted set by deliver_at),
/// [receipt]. ARGV: id, deliver_at, record, fingerprint (hex), receipt ttl
/// ms. Returns `{'ok'}`, `{'dup', id, deliver_at}` or `{'mismatch'}`.
pub(crate) static SCHED_ADD: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local at, ttl = tonumber(ARGV[2]), tonumber(ARGV[5])
if not (at and ttl) or ARGV[1] == '' or ttl <= 0 then
  return redis.error_reply('ERR herald schedule: bad arguments')
end
local receipt = KEYS[3]
if receipt then
  local r = redis.call('GET', receipt)
  if r then
    local fp, id, da = string.match(r, '^(%S+) (%S+) (%S+)$')
    if not fp then return redis.error_reply('ERR herald schedule: malformed receipt') end
    if fp ~= ARGV[4] then return {'mismatch'} end
    return {'dup', id, da}
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[2], fmt(at), ARGV[1])
if receipt then
  redis.call('SET', receipt, ARGV[4] .. ' ' .. ARGV[1] .. ' ' .. fmt(at), 'PX', fmt(ttl))
end
return {'ok'}
"#,
    )
});

/// Claim a schedule: a lease with a fencing token that only grows.
///
/// KEYS: sched, claims (hash id → `<token> <until_ms>`). ARGV: id, lease
/// ms. Returns `{'ok', token, record}`, `{'held'}` (under an unexpired
/// claim) or `{'missing'}` (delivered or cancelled).
pub(crate) static SCHED_CLAIM: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local lease = tonumber(ARGV[2])
if not lease or lease <= 0 then return redis.error_reply('ERR herald claim: bad arguments') end
local record = redis.call('HGET', KEYS[1], ARGV[1])
if not record then
  redis.call('HDEL', KEYS[2], ARGV[1])
  return {'missing'}
end
local now = ms_now()
local token = 0
local cur = redis.call('HGET', KEYS[2], ARGV[1])
if cur then
  local t, untl = string.match(cur, '^(%d+) (%d+)$')
  if t then
    if tonumber(untl) > now then return {'held'} end
    token = tonumber(t)
  end
end
token = token + 1
redis.call('HSET', KEYS[2], ARGV[1], fmt(token) .. ' ' .. fmt(now + lease))
return {'ok', fmt(token), record}
"#,
    )
});

/// Deliver a claimed schedule: the append (as APPEND does it, without
/// dedup) and the removal of the schedule, in one step, only while the
/// schedule is stored and the claim's token is its latest.
///
/// KEYS: meta, log, sched, sched idx, claims. ARGV: id, token, durable,
/// fresh epoch, max_len, max_age_ms, frame head, middle, tail, message id,
/// channel, fan, publish command. Returns `{'ok', seq|'-', ts, epoch|'-',
/// lost}`, `{'stale'}` or `{'closed'}`.
pub(crate) static SCHED_DELIVER: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local max_len, max_age = tonumber(ARGV[5]), tonumber(ARGV[6])
if not (max_len and max_age) or (ARGV[13] ~= 'PUBLISH' and ARGV[13] ~= 'SPUBLISH') or ARGV[10] == '' then
  return redis.error_reply('ERR herald deliver: bad arguments')
end
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 0 then return {'stale'} end
local cur = redis.call('HGET', KEYS[5], ARGV[1])
if not cur or string.match(cur, '^(%d+) ') ~= ARGV[2] then return {'stale'} end
if is_closed(KEYS[1]) then return {'closed'} end
local durable = ARGV[3] == '1'
local r = append_msg(KEYS[1], KEYS[2], {
  durable = durable, closes = false, epoch = ARGV[4], max_len = max_len, max_age = max_age,
  head = ARGV[7], middle = ARGV[8], tail = ARGV[9], id = ARGV[10], channel = ARGV[11],
  fan = ARGV[12], publish = ARGV[13],
})
if r.err then return r.err end
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
return {'ok', r.sseq, fmt(r.ts), r.sepoch, r.lost}
"#,
    )
});

/// Cancel a schedule. KEYS: sched, sched idx, claims. ARGV: id. Returns
/// the record, or nil when there is none.
pub(crate) static SCHED_CANCEL: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local record = redis.call('HGET', KEYS[1], ARGV[1])
if not record then return false end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return record
"#,
    )
});
