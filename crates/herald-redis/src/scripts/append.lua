-- KEYS: (meta, log, receipt...)...
-- ARGV: publish, (epoch, channel, fan, meta_at, count,
--   (durable, max_len, max_age_ms, fingerprint, receipt_ttl_ms, head, middle, tail, id, closes,
--   receipt_at)...)...
local F = 11 -- the arguments of one message (see the header)
local function bad() return redis.error_reply('ERR herald append: bad arguments') end
local publish = ARGV[1]
if publish ~= 'PUBLISH' and publish ~= 'SPUBLISH' then return bad() end
if #ARGV < 2 then return bad() end
-- Every argument is checked before the first write: a first pass that
-- keeps nothing; the second reads the arguments again where they are.
local b = 2
while b <= #ARGV do
  local meta_at, count = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  if not (meta_at and count) or ARGV[b + 1] == '' or count < 1 or meta_at < 1 or meta_at + 1 > #KEYS
     or b + 4 + count * F > #ARGV then
    return bad()
  end
  b = b + 5
  for _ = 1, count do
    local max_len, max_age, ttl, rk = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 4]),
      tonumber(ARGV[b + 10])
    if not (max_len and max_age and ttl and rk) or max_len < 0 or max_age < 0 or ttl <= 0
       or (ARGV[b] ~= '1' and ARGV[b] ~= '0') or ARGV[b + 8] == ''
       or (ARGV[b + 9] ~= '1' and ARGV[b + 9] ~= '0')
       or (rk ~= 0 and (rk < meta_at + 2 or rk > #KEYS)) then
      return bad()
    end
    b = b + F
  end
end
local now = ms_now()
local now_s = fmt(now)
-- One line per message, in order: a flat reply the node reads without a
-- value per field.
local out = {}
-- append_msg's arguments, one table refilled for every message.
local a = {publish = publish}
b = 2
while b <= #ARGV do
  local meta_at, count = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  local meta, log = KEYS[meta_at], KEYS[meta_at + 1]
  a.epoch, a.channel, a.fan = ARGV[b], ARGV[b + 1], ARGV[b + 2]
  b = b + 5
  for _ = 1, count do
    local line
    local rk = tonumber(ARGV[b + 10])
    local receipt, fp = rk > 0 and KEYS[rk] or nil, ARGV[b + 3]
    local r = receipt and redis.call('GET', receipt)
    if r then
      local rfp, seq, id, ts, epoch = string.match(r, '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
      if not rfp then
        line = 'err malformed receipt'
      elseif rfp ~= fp then
        line = 'mismatch'
      else
        line = 'dup ' .. seq .. ' ' .. id .. ' ' .. ts .. ' ' .. epoch
      end
    else
      local st = meta_of(meta)
      if st[4] == '1' then
        line = 'closed'
      else
        local durable = ARGV[b] == '1'
        a.durable, a.closes = durable, durable and ARGV[b + 9] == '1'
        a.max_len, a.max_age = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
        a.head, a.middle, a.tail, a.id = ARGV[b + 5], ARGV[b + 6], ARGV[b + 7], ARGV[b + 8]
        local m = append_msg(meta, log, a, st, now, now_s)
        if m.err then
          line = 'err ' .. string.gsub(tostring(m.err.err or m.err), '\n', ' ')
        else
          if receipt then
            redis.call('SET', receipt, fp .. ' ' .. m.sseq .. ' ' .. a.id .. ' ' .. m.sts .. ' ' .. m.sepoch,
              'PX', fmt(tonumber(ARGV[b + 4])))
          end
          line = 'ok ' .. m.sseq .. ' ' .. m.sts .. ' ' .. m.sepoch .. (m.lost == 1 and ' 1' or ' 0')
        end
      end
    end
    out[#out + 1] = line
    b = b + F
  end
end
return table.concat(out, '\n')
