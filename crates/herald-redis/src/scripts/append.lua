-- KEYS: meta, log, receipt...
-- ARGV: epoch, channel, fan, publish,
--   (durable, max_len, max_age_ms, fingerprint, receipt_ttl_ms, head, middle, tail, id, closes,
--   receipt_at)...
local F = 11 -- the arguments of one message (see the header)
local n = (#ARGV - 4) / F
if n < 1 or n ~= math.floor(n) or (ARGV[4] ~= 'PUBLISH' and ARGV[4] ~= 'SPUBLISH') or ARGV[2] == '' then
  return redis.error_reply('ERR herald append: bad arguments')
end
local msgs = {}
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
  msgs[i] = {
    receipt = rk > 0 and KEYS[rk] or nil, fp = ARGV[b + 4], ttl = ttl,
    a = {
      durable = durable, closes = durable and ARGV[b + 10] == '1', epoch = ARGV[1], max_len = max_len,
      max_age = max_age, head = ARGV[b + 6], middle = ARGV[b + 7], tail = ARGV[b + 8], id = ARGV[b + 9],
      channel = ARGV[2], fan = ARGV[3], publish = ARGV[4],
    },
  }
end
local meta, log = KEYS[1], KEYS[2]
local out = {}
for i, m in ipairs(msgs) do
  local reply
  local r = m.receipt and redis.call('GET', m.receipt)
  if r then
    local fp, seq, id, ts, epoch = string.match(r, '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
    if not fp then
      reply = {'err', 'malformed receipt'}
    elseif fp ~= m.fp then
      reply = {'mismatch'}
    else
      reply = {'dup', seq, id, ts, epoch}
    end
  elseif is_closed(meta) then
    reply = {'closed'}
  else
    local a = append_msg(meta, log, m.a)
    if a.err then
      reply = {'err', tostring(a.err.err or a.err)}
    else
      if m.receipt then
        redis.call('SET', m.receipt, m.fp .. ' ' .. a.sseq .. ' ' .. m.a.id .. ' ' .. fmt(a.ts) .. ' '
          .. a.sepoch, 'PX', fmt(m.ttl))
      end
      reply = {'ok', a.sseq, fmt(a.ts), a.sepoch, a.lost}
    end
  end
  out[i] = reply
end
return out
