-- KEYS: (meta, log, receipt...)...
-- ARGV: publish, (epoch, channel, fan, meta_at, count,
--   (durable, max_len, max_age_ms, fingerprint, receipt_ttl_ms, head, middle, tail, id, closes,
--   receipt_at)...)...
local F = 11 -- the arguments of one message (see the header)
local function bad() return redis.error_reply('ERR herald append: bad arguments') end
local publish = ARGV[1]
if publish ~= 'PUBLISH' and publish ~= 'SPUBLISH' then return bad() end
-- Every argument is checked before the first write.
local groups = {}
local b = 2
while b <= #ARGV do
  local meta_at, count = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  if not (meta_at and count) or ARGV[b + 1] == '' or count < 1 or meta_at < 1 or meta_at + 1 > #KEYS
     or b + 4 + count * F > #ARGV then
    return bad()
  end
  local g = {meta = KEYS[meta_at], log = KEYS[meta_at + 1], msgs = {}}
  local epoch, channel, fan = ARGV[b], ARGV[b + 1], ARGV[b + 2]
  b = b + 4
  for i = 1, count do
    local max_len, max_age, ttl, rk = tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 5]),
      tonumber(ARGV[b + 11])
    if not (max_len and max_age and ttl and rk) or max_len < 0 or max_age < 0 or ttl <= 0
       or (ARGV[b + 1] ~= '1' and ARGV[b + 1] ~= '0') or ARGV[b + 9] == ''
       or (ARGV[b + 10] ~= '1' and ARGV[b + 10] ~= '0')
       or (rk ~= 0 and (rk < meta_at + 2 or rk > #KEYS)) then
      return bad()
    end
    local durable = ARGV[b + 1] == '1'
    g.msgs[i] = {
      receipt = rk > 0 and KEYS[rk] or nil, fp = ARGV[b + 4], ttl = ttl,
      a = {
        durable = durable, closes = durable and ARGV[b + 10] == '1', epoch = epoch, max_len = max_len,
        max_age = max_age, head = ARGV[b + 6], middle = ARGV[b + 7], tail = ARGV[b + 8], id = ARGV[b + 9],
        channel = channel, fan = fan, publish = publish,
      },
    }
    b = b + F
  end
  b = b + 1
  groups[#groups + 1] = g
end
if #groups == 0 then return bad() end
local now = ms_now()
-- One line per message, in order: a flat reply the node reads without a
-- value per field.
local out = {}
for _, g in ipairs(groups) do
  for _, m in ipairs(g.msgs) do
    local line
    local r = m.receipt and redis.call('GET', m.receipt)
    if r then
      local fp, seq, id, ts, epoch = string.match(r, '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
      if not fp then
        line = 'err malformed receipt'
      elseif fp ~= m.fp then
        line = 'mismatch'
      else
        line = 'dup ' .. seq .. ' ' .. id .. ' ' .. ts .. ' ' .. epoch
      end
    else
      local st = meta_of(g.meta)
      if st[4] == '1' then
        line = 'closed'
      else
        local a = append_msg(g.meta, g.log, m.a, st, now)
        if a.err then
          line = 'err ' .. string.gsub(tostring(a.err.err or a.err), '\n', ' ')
        else
          if m.receipt then
            redis.call('SET', m.receipt, m.fp .. ' ' .. a.sseq .. ' ' .. m.a.id .. ' ' .. fmt(a.ts) .. ' '
              .. a.sepoch, 'PX', fmt(m.ttl))
          end
          line = 'ok ' .. a.sseq .. ' ' .. fmt(a.ts) .. ' ' .. a.sepoch .. ' ' .. fmt(a.lost)
        end
      end
    end
    out[#out + 1] = line
  end
end
return table.concat(out, '\n')
