-- KEYS: (meta, log, receipt...)...
-- ARGV: publish, (c, epoch, channel, fan, message...)...; a message is durable:
--   (1, max_len, max_age_ms, head, middle, tail, id, closes, receipt[, fingerprint, receipt_ttl_ms])
--   or volatile: (0, receipt, id, head_middle, tail[, fingerprint, receipt_ttl_ms])
--   (the last two with a receipt only)
local function bad() return redis.error_reply('ERR herald append: bad arguments') end
-- A channel is `c` and its three arguments, then its messages (one or
-- more). Its keys are its meta and log, then the receipt key of each of
-- its messages whose `receipt` is 1, in order: the keys are taken in
-- order, and every key must be used exactly once.
-- As locals: a global is a table lookup at every use.
local ARGV, KEYS = ARGV, KEYS
local publish = ARGV[1]
if publish ~= 'PUBLISH' and publish ~= 'SPUBLISH' then return bad() end
-- Every argument is checked before the first write: a first pass that
-- keeps nothing; the second reads the arguments again where they are.
-- Only what a message's path reads is checked (a receipt's TTL only with
-- a receipt). Nothing is converted to a number here: flags are compared
-- as text and counts matched as canonical decimals (tonumber is a strtod).
local n, nkeys = #ARGV, #KEYS
-- b: the next argument; k: the next key; messages: of the current channel.
local b, k, messages = 2, 1, nil
while b <= n do
  local kind = ARGV[b]
  if kind == 'c' then
    if messages == 0 or b + 3 > n or ARGV[b + 2] == '' then return bad() end
    k, messages, b = k + 2, 0, b + 4
  else
    if not messages or (kind ~= '1' and kind ~= '0') then return bad() end
    local durable = kind == '1'
    -- The message's arguments (see the header).
    local receipt = durable and ARGV[b + 8] or ARGV[b + 1]
    if receipt ~= '1' and receipt ~= '0' then return bad() end
    local w = (durable and 9 or 5) + (receipt == '1' and 2 or 0)
    if b + w - 1 > n then return bad() end
    local ttl, id
    if durable then
      ttl, id = ARGV[b + 10], ARGV[b + 6]
      if not is_count(ARGV[b + 1]) or not is_count(ARGV[b + 2]) or (ARGV[b + 7] ~= '1' and ARGV[b + 7] ~= '0') then
        return bad()
      end
    else
      ttl, id = ARGV[b + 6], ARGV[b + 2]
    end
    if id == '' then return bad() end
    if receipt == '1' then
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
local a = {publish = publish, durable = true}
-- The last max_age converted, as text and as a number.
local max_age_s, max_age = '0', 0
b, k = 2, 1
local meta, log
while b <= n do
  if ARGV[b] == 'c' then
    a.epoch, a.channel, a.fan = ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
    meta, log = KEYS[k], KEYS[k + 1]
    k, b = k + 2, b + 4
  else
    local channel, fan = a.channel, a.fan
    local line
    local durable = ARGV[b] == '1'
    -- Whether it has a receipt, its fingerprint and TTL, and the id.
    local rflag, fp, ttl, id
    if durable then
      rflag, fp, ttl, id = ARGV[b + 8], ARGV[b + 9], ARGV[b + 10], ARGV[b + 6]
    else
      rflag, fp, ttl, id = ARGV[b + 1], ARGV[b + 5], ARGV[b + 6], ARGV[b + 2]
    end
    local receipt
    if rflag == '1' then
      receipt, k = KEYS[k], k + 1
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
          publish_volatile(publish, fan, channel, sts, id, sepoch, ARGV[b + 3], ARGV[b + 4])
        end
      else
        local st = meta_of(meta)
        if st[4] == '1' then
          line = 'closed'
        else
          a.closes = ARGV[b + 7] == '1'
          -- max_age as a number, converted once for a run of equal ones
          -- (Lua's strings are interned: equal text is the same string).
          if ARGV[b + 2] ~= max_age_s then
            max_age_s = ARGV[b + 2]
            max_age = tonumber(max_age_s)
          end
          a.max_len, a.max_age = ARGV[b + 1], max_age
          a.head, a.middle, a.tail, a.id = ARGV[b + 3], ARGV[b + 4], ARGV[b + 5], id
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
    b = b + (durable and 9 or 5) + (receipt and 2 or 0)
  end
end
return table.concat(out, '\n')
