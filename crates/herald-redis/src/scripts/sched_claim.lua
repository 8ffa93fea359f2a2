-- KEYS: sched, claims
-- ARGV: id, lease_ms
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
