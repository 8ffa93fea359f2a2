-- KEYS: (meta, log, receipt...)...
-- ARGV: publish, (epoch, channel, fan, meta_at, count, message...)...; a message is durable:
--   (1, max_len, max_age_ms, fingerprint, receipt_ttl_ms, head, middle, tail, id, closes, receipt_at)
--   or volatile: (0, receipt_at, id, head_middle, tail[, fingerprint, receipt_ttl_ms])
--   (the last two with a receipt only)
local function bad() return redis.error_reply('ERR herald append: bad arguments') end
local publish = ARGV[1]
if publish ~= 'PUBLISH' and publish ~= 'SPUBLISH' then return bad() end
-- Every argument is checked before the first write: a first pass that
-- keeps nothing; the second reads the arguments again where they are.
-- Only what a message's path reads is checked (a receipt's TTL only with
-- a receipt); a flag or a `receipt_at` of 0 is compared as text, not
-- converted (tonumber is a strtod).
local n, nkeys = #ARGV, #KEYS
if n < 2 then return bad() end
local b = 2
while b <= n do
  local meta_at, count = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  if not (meta_at and count) or ARGV[b + 1] == '' or count < 1 or meta_at < 1 or meta_at + 1 > nkeys then
    return bad()
  end
  b = b + 5
  for _ = 1, count do
    local durable = ARGV[b]
    if durable ~= '1' and durable ~= '0' then return bad() end
    -- The message's arguments (see the header).
    local w = durable == '1' and 11 or (ARGV[b + 1] == '0' and 5 or 7)
    if b + w - 1 > n then return bad() end
    local rk, ttl, id
    if durable == '1' then
      rk, ttl, id = ARGV[b + 10], ARGV[b + 4], ARGV[b + 8]
      local max_age = tonumber(ARGV[b + 2])
      if not is_count(ARGV[b + 1]) or not max_age or max_age < 0 or (ARGV[b + 9] ~= '1' and ARGV[b + 9] ~= '0') then
        return bad()
      end
    else
      rk, ttl, id = ARGV[b + 1], ARGV[b + 6], ARGV[b + 2]
    end
    if id == '' then return bad() end
    if rk ~= '0' then
      rk, ttl = tonumber(rk), tonumber(ttl)
      if not (rk and ttl) or rk < meta_at + 2 or rk > nkeys or ttl <= 0 then return bad() end
    end
    b = b + w
  end
end
local now = ms_now()
local now_s = fmt(now)
-- One line per message, in order: a flat reply the node reads without a
-- value per field.
local out = {}
-- append_msg's arguments, one table refilled for every durable message.
local a = {publish = publish, durable = true}
b = 2
while b <= n do
  local meta_at, count = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  local meta, log = KEYS[meta_at], KEYS[meta_at + 1]
  local channel, fan = ARGV[b + 1], ARGV[b + 2]
  a.epoch, a.channel, a.fan = ARGV[b], channel, fan
  b = b + 5
  for _ = 1, count do
    local line
    local durable = ARGV[b] == '1'
    -- The receipt's key, fingerprint and TTL (an index into ARGV), and the id.
    local rk, fp, ttl_at, id
    if durable then
      rk, fp, ttl_at, id = ARGV[b + 10], ARGV[b + 3], b + 4, ARGV[b + 8]
    else
      rk, fp, ttl_at, id = ARGV[b + 1], ARGV[b + 5], b + 6, ARGV[b + 2]
    end
    local receipt = rk ~= '0' and KEYS[tonumber(rk)] or nil
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
          a.closes = ARGV[b + 9] == '1'
          a.max_len, a.max_age = ARGV[b + 1], ARGV[b + 2] == '0' and 0 or tonumber(ARGV[b + 2])
          a.head, a.middle, a.tail, a.id = ARGV[b + 5], ARGV[b + 6], ARGV[b + 7], id
          local m = append_msg(meta, log, a, st, now, now_s)
          if m.err then
            line = 'err ' .. string.gsub(tostring(m.err.err or m.err), '\n', ' ')
          else
            sseq, sts, sepoch, lost = m.sseq, m.sts, m.sepoch, m.lost
          end
        end
      end
      if sseq then
        if receipt then
          redis.call('SET', receipt, fp .. ' ' .. sseq .. ' ' .. id .. ' ' .. sts .. ' ' .. sepoch, 'PX',
            fmt(tonumber(ARGV[ttl_at])))
        end
        line = 'ok ' .. sseq .. ' ' .. sts .. ' ' .. sepoch .. (lost == 1 and ' 1' or ' 0')
      end
    end
    out[#out + 1] = line
    b = b + (durable and 11 or (rk == '0' and 5 or 7))
  end
end
return table.concat(out, '\n')
