-- KEYS: meta, presence, presence_exp, presence_keys, presence_gone, presence_gone_exp
-- ARGV: member_key, member, token, ttl_ms
local ttl = tonumber(ARGV[4])
if not ttl or ttl <= 0 or ARGV[1] == '' or ARGV[2] == '' or not string.match(ARGV[3], '^%d+$') then
  return redis.error_reply('ERR herald rejoin: bad arguments')
end
if is_closed(KEYS[1]) then return {'closed'} end
local now = ms_now()
local exp = now + ttl
local rec = redis.call('HGET', KEYS[2], ARGV[1])
if rec then
  local token, member = string.match(rec, '^(%d+) %d+ (.*)$')
  if not token then return redis.error_reply('ERR herald rejoin: malformed lease') end
  if token ~= ARGV[3] then return {'fenced'} end
  redis.call('HSET', KEYS[2], ARGV[1], token .. ' ' .. fmt(exp) .. ' ' .. member)
  redis.call('ZADD', KEYS[3], fmt(exp), ARGV[1])
  return {'held', fmt(exp)}
end
gone_prune(KEYS[5], KEYS[6], now)
local g = redis.call('HGET', KEYS[5], ARGV[1])
if g then
  local t, how = string.match(g, '^(%d+) (%a)$')
  if t and (tonumber(t) > tonumber(ARGV[3]) or (t == ARGV[3] and how == 'l')) then return {'fenced'} end
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3] .. ' ' .. fmt(exp) .. ' ' .. ARGV[2])
redis.call('ZADD', KEYS[3], fmt(exp), ARGV[1])
redis.call('ZADD', KEYS[4], 0, ARGV[1])
return {'back', fmt(exp)}
