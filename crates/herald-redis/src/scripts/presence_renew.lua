-- KEYS: presence, presence_exp
-- ARGV: member_key, token, ttl_ms
local ttl = tonumber(ARGV[3])
if not ttl or ttl <= 0 or ARGV[1] == '' then
  return redis.error_reply('ERR herald renew: bad arguments')
end
local rec = redis.call('HGET', KEYS[1], ARGV[1])
if not rec then return {'gone'} end
local token, member = string.match(rec, '^(%d+) %d+ (.*)$')
if not token then return redis.error_reply('ERR herald renew: malformed lease') end
if token ~= ARGV[2] then return {'superseded'} end
local exp = ms_now() + ttl
redis.call('HSET', KEYS[1], ARGV[1], token .. ' ' .. fmt(exp) .. ' ' .. member)
redis.call('ZADD', KEYS[2], fmt(exp), ARGV[1])
return {'until', fmt(exp)}
