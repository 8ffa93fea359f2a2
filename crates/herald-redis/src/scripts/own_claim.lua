-- KEYS: owner, counter
-- ARGV: holder, ttl_ms
local cur = redis.call('GET', KEYS[1])
if cur then
  local sp = string.find(cur, ' ', 1, true)
  local token = tonumber(string.sub(cur, 1, sp - 1))
  if string.sub(cur, sp + 1) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return token
  end
  return -1
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. ' ' .. ARGV[1], 'PX', ARGV[2])
return token
