-- KEYS: lease
-- ARGV: token, ttl_ms
local cur = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if cur == ARGV[1] then return 0 end
if not cur then return 1 end
return 2
