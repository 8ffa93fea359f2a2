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
"#;

fn script(body: &str) -> Script {
    Script::new(&format!("#!lua\n{HELPERS}\n{body}"))
}

/// Append (durable or volatile) with dedup, atomically.
///
/// KEYS: meta, log, [receipt]. ARGV: durable (`1`/`0`), a fresh epoch (used
/// if the channel has none), max_len, max_age_ms, fingerprint (hex),
/// receipt ttl ms, frame head, frame middle, frame tail, message id,
/// channel, fan-out pub/sub channel, `PUBLISH` or `SPUBLISH`.
///
/// Returns `{'ok', seq|'-', ts, epoch|'-', lost}`, `{'dup', seq|'-', id,
/// ts, epoch|'-'}` or `{'mismatch'}`.
///
/// The fan-out is published from inside the script: Redis runs scripts of
/// one slot one at a time, so the pub/sub order of a channel is its seq
/// order, and no crash of a node between append and publish can lose it.
/// Redis sends it to subscribers only after the write reached the AOF
/// (under `appendfsync always`, after the fsync), like the reply.
pub(crate) static APPEND: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local durable = ARGV[1] == '1'
local max_len, max_age, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[6])
if not (max_len and max_age and ttl) or max_len < 0 or max_age < 0 or ttl <= 0
   or (ARGV[13] ~= 'PUBLISH' and ARGV[13] ~= 'SPUBLISH') or ARGV[10] == '' then
  return redis.error_reply('ERR herald append: bad arguments')
end
local meta, log, receipt = KEYS[1], KEYS[2], KEYS[3]
if receipt then
  local r = redis.call('GET', receipt)
  if r then
    local fp, seq, id, ts, epoch = string.match(r, '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
    if not fp then return redis.error_reply('ERR herald append: malformed receipt') end
    if fp ~= ARGV[5] then return {'mismatch'} end
    return {'dup', seq, id, ts, epoch}
  end
end
local ts = ms_now()
local epoch, seq, lost, frame = '', nil, 0, nil
if durable then
  local head
  epoch, head, lost = ensure_meta(meta, log, ARGV[2])
  local last_ts = tonumber(redis.call('HGET', meta, 'ts') or '0')
  if last_ts > ts then ts = last_ts end
  seq = head + 1
  local function xadd()
    frame = ARGV[7] .. fmt(seq) .. ARGV[8] .. fmt(ts) .. ARGV[9]
    if max_len > 0 then
      return redis.pcall('XADD', log, 'MAXLEN', '=', fmt(max_len), fmt(seq) .. '-0',
        't', fmt(ts), 'i', ARGV[10], 'f', frame)
    end
    return redis.pcall('XADD', log, fmt(seq) .. '-0', 't', fmt(ts), 'i', ARGV[10], 'f', frame)
  end
  local added = xadd()
  if type(added) == 'table' and added.err then
    -- The stream is ahead of the meta (Redis lost part of the meta): go on
    -- after the stream's last seq, in a new epoch.
    local last = stream_last(log)
    if not last or last < seq then return added end
    seq, epoch, lost = last + 1, ARGV[2], 1
    added = xadd()
    if type(added) == 'table' and added.err then return added end
  end
  redis.call('HSET', meta, 'epoch', epoch, 'seq', fmt(seq), 'ts', fmt(ts))
  if max_age > 0 then
    -- Messages older than max_age go. The log is ordered by ts and
    -- gap-free, so a binary search finds the first one to keep; the
    -- message just added is always kept.
    local cutoff = ts - max_age
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
    redis.call('PEXPIRE', log, fmt(max_age))
  else
    redis.call('PERSIST', log)
  end
else
  epoch = redis.call('HGET', meta, 'epoch') or ''
  frame = ARGV[7] .. ARGV[8] .. fmt(ts) .. ARGV[9]
end
local sseq = '-'
if seq then sseq = fmt(seq) end
local sepoch = epoch
if sepoch == '' then sepoch = '-' end
if receipt then
  redis.call('SET', receipt, ARGV[5] .. ' ' .. sseq .. ' ' .. ARGV[10] .. ' ' .. fmt(ts) .. ' ' .. sepoch,
    'PX', fmt(ttl))
end
redis.call(ARGV[13], ARGV[12],
  'v1 ' .. ARGV[11] .. ' ' .. sseq .. ' ' .. fmt(ts) .. ' ' .. ARGV[10] .. ' ' .. sepoch .. '\n' .. frame)
return {'ok', sseq, fmt(ts), sepoch, lost}
"#,
    )
});

/// Position and (with `limit > 0`) a page of the log, in one snapshot.
///
/// KEYS: meta, log. ARGV: a fresh epoch (used if the channel has none),
/// after, limit. Returns `{epoch, head, first, lost, entries}`, entries as
/// XRANGE gives them, seqs `after+1 ..= head`.
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
return {epoch, fmt(head), fmt(first), lost, entries}
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
