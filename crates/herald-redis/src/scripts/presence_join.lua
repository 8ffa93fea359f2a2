-- KEYS: meta, presence, presence_exp, presence_keys, presence_token
-- ARGV: member_key, member, ttl_ms
local ttl = tonumber(ARGV[3])
if not ttl or ttl <= 0 or ARGV[1] == '' or ARGV[2] == '' then
  return redis.error_reply('ERR herald join: bad arguments')
end
if is_closed(KEYS[1]) then return {'closed'} end
local now = ms_now()
if redis.call('EXISTS', KEYS[5]) == 0 then
  -- A channel's counter is never deleted; missing means never used, or
  -- lost with Redis's data. Start above every token handed out before
  -- (fewer than 1000 joins per ms on the channel, on average, since its
  -- first), so a holder of a token from before the loss is still fenced.
  redis.call('SET', KEYS[5], fmt(now * 1000))
end
local token = redis.call('INCR', KEYS[5])
local exp = now + ttl
local had = redis.call('HEXISTS', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], fmt(token) .. ' ' .. fmt(exp) .. ' ' .. ARGV[2])
redis.call('ZADD', KEYS[3], fmt(exp), ARGV[1])
redis.call('ZADD', KEYS[4], 0, ARGV[1])
local kind = 'new'
if had == 1 then kind = 'reclaimed' end
return {kind, fmt(token), fmt(exp)}
