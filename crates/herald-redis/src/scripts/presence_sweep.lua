-- KEYS: presence, presence_exp, presence_keys, presence_gone, presence_gone_exp
-- ARGV: limit
local limit = tonumber(ARGV[1])
if not limit or limit < 1 then return redis.error_reply('ERR herald sweep: bad arguments') end
local now = ms_now()
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', fmt(now), 'LIMIT', 0, limit)
local out = {}
for _, k in ipairs(due) do
  local rec = redis.call('HGET', KEYS[1], k)
  redis.call('HDEL', KEYS[1], k)
  redis.call('ZREM', KEYS[2], k)
  redis.call('ZREM', KEYS[3], k)
  if rec then
    out[#out + 1] = rec
    local token = string.match(rec, '^(%d+) ')
    if token then gone_note(KEYS[4], KEYS[5], k, token, false, now) end
  end
end
gone_prune(KEYS[4], KEYS[5], now)
local nxt = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
return {nxt[2] or '', out}
