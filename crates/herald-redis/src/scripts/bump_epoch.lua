-- KEYS: meta
-- ARGV: expected, new
local cur = redis.call('HGET', KEYS[1], 'epoch')
if cur and cur == ARGV[1] then
  redis.call('HSET', KEYS[1], 'epoch', ARGV[2])
  return {1, ARGV[2]}
end
return {0, cur or ''}
