-- KEYS: sched, sched_idx, [receipt]
-- ARGV: id, deliver_at, record, fingerprint, receipt_ttl_ms
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
