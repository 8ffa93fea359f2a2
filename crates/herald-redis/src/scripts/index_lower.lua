-- KEYS: due
-- ARGV: channel, score, ttl_ms
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
