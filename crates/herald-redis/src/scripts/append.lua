-- KEYS: (meta, log, receipt...)...
-- ARGV: publish, epoch, (c, channel, fan, message...)...; a message is durable:
--   (d[c][r], max_len, max_age_ms, head, id, tail[, fingerprint, receipt_ttl_ms])
--   or volatile: (v[r], id, head, tail[, fingerprint, receipt_ttl_ms])
--   (the last two with a receipt only)
local function bad() return redis.error_reply('ERR herald append: bad arguments') end
-- `epoch` is a fresh one, for a channel that has none. A message's kind
-- says what it is: `d` durable or `v` volatile, then `c` if it closes its
-- channel (durable only) and `r` if it has a receipt. A durable frame is
-- head .. seq .. ',"id":"' .. id .. '","ts":' .. ts .. tail (frame_of); a
-- volatile one (no seq) head .. ts .. tail.
-- A channel is `c` and its two arguments, then its messages (one or
-- more). Its keys are its meta and log, then the receipt key of each of
-- its messages with a receipt, in order: the keys are taken in order, and
-- every key must be used exactly once.
-- What each kind says, by the indexes below (one table lookup per
-- message; an array index is cheaper than a field name).
local DURABLE, CLOSES, RECEIPT = 1, 2, 3
local KINDS = {
  d = {true, false, false}, dc = {true, true, false}, dr = {true, false, true}, dcr = {true, true, true},
  v = {false, false, false}, vr = {false, false, true},
}
-- A message's number of arguments, by its durable and receipt.
local function width(durable, receipt) return (durable and 6 or 4) + (receipt and 2 or 0) end
-- As locals: a global is a table lookup at every use.
local ARGV, KEYS = ARGV, KEYS
local publish = ARGV[1]
if publish ~= 'PUBLISH' and publish ~= 'SPUBLISH' then return bad() end
-- Every argument is checked before the first write: a first pass that
-- keeps nothing; the second reads the arguments again where they are.
-- Only what a message's path reads is checked (a receipt's TTL only with
-- a receipt). Nothing is converted to a number here: counts are matched
-- as canonical decimals (tonumber is a strtod).
local n, nkeys = #ARGV, #KEYS
if n < 2 or ARGV[2] == '' then return bad() end
-- b: the next argument; k: the next key; messages: of the current channel.
local b, k, messages = 3, 1, nil
while b <= n do
  local kind = ARGV[b]
  if kind == 'c' then
    if messages == 0 or b + 2 > n or ARGV[b + 1] == '' then return bad() end
    k, messages, b = k + 2, 0, b + 3
  else
    local f = KINDS[kind]
    if not messages or not f then return bad() end
    local durable, receipt = f[DURABLE], f[RECEIPT]
    local w = width(durable, receipt)
    if b + w - 1 > n then return bad() end
    if durable then
      if not is_count(ARGV[b + 1]) or not is_count(ARGV[b + 2]) or ARGV[b + 4] == '' then return bad() end
    elseif ARGV[b + 1] == '' then
      return bad()
    end
    if receipt then
      local ttl = ARGV[b + w - 1]
      if ttl == '0' or not is_count(ttl) then return bad() end
      k = k + 1
    end
    messages, b = messages + 1, b + w
  end
end
if not messages or messages == 0 or k - 1 ~= nkeys then return bad() end
local now = ms_now()
local now_s = fmt(now)
-- One line per message, in order: a flat reply the node reads without a
-- value per field.
local out = {}
-- append_msg's arguments, one table refilled for every durable message.
local a = {publish = publish, durable = true, epoch = ARGV[2]}
-- The last max_age converted, as text and as a number.
local max_age_s, max_age = '0', 0
b, k = 3, 1
local meta, log
while b <= n do
  if ARGV[b] == 'c' then
    a.channel, a.fan = ARGV[b + 1], ARGV[b + 2]
    meta, log = KEYS[k], KEYS[k + 1]
    k, b = k + 2, b + 3
  else
    local channel, fan = a.channel, a.fan
    local line
    local f = KINDS[ARGV[b]]
    local durable = f[DURABLE]
    local w = width(durable, f[RECEIPT])
    local id = durable and ARGV[b + 4] or ARGV[b + 1]
    -- With a receipt: its key, the fingerprint and the TTL.
    local receipt, fp, ttl
    if f[RECEIPT] then
      receipt, k = KEYS[k], k + 1
      fp, ttl = ARGV[b + w - 2], ARGV[b + w - 1]
    end
    local r = receipt and redis.call('GET', receipt)
    if r then
      local rfp, seq, rid, ts, epoch = string.match(r, '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
      if not rfp then
        line = 'err malformed receipt'
      elseif rfp ~= fp then
        line = 'mismatch'
      else
        line = 'dup ' .. seq .. ' ' .. rid .. ' ' .. ts .. ' ' .. epoch
      end
    else
      -- What the message became (its seq, ts and epoch as text), unless
      -- `line` already says why it was not appended.
      local sseq, sts, sepoch, lost
      if not durable then
        -- Volatile: the meta's epoch and closed flag are all it reads.
        local v = redis.call('HMGET', meta, 'epoch', 'closed')
        if v[2] == '1' then
          line = 'closed'
        else
          sseq, sts, sepoch, lost = '-', now_s, or_dash(v[1]), 0
          publish_volatile(publish, fan, channel, sts, id, sepoch, ARGV[b + 2], ARGV[b + 3])
        end
      else
        local st = meta_of(meta)
        if st[4] == '1' then
          line = 'closed'
        else
          a.closes = f[CLOSES]
          -- max_age as a number, converted once for a run of equal ones
          -- (Lua's strings are interned: equal text is the same string).
          if ARGV[b + 2] ~= max_age_s then
            max_age_s = ARGV[b + 2]
            max_age = tonumber(max_age_s)
          end
          a.max_len, a.max_age = ARGV[b + 1], max_age
          a.head, a.tail, a.id = ARGV[b + 3], ARGV[b + 5], id
          local err
          err, sseq, sts, sepoch, lost = append_msg(meta, log, a, st, now, now_s)
          if err then
            line = 'err ' .. string.gsub(tostring(err.err or err), '\n', ' ')
          end
        end
      end
      if sseq then
        if receipt then
          redis.call('SET', receipt, fp .. ' ' .. sseq .. ' ' .. id .. ' ' .. sts .. ' ' .. sepoch, 'PX', ttl)
        end
        line = 'ok ' .. sseq .. ' ' .. sts .. ' ' .. sepoch .. (lost == 1 and ' 1' or ' 0')
      end
    end
    out[#out + 1] = line
    b = b + w
  end
end
return table.concat(out, '\n')
