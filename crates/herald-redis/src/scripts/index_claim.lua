-- KEYS: due
-- ARGV: n, claim_ms
local n, claim_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
if not (n and claim_ms) or n < 1 or claim_ms < 1 then
  return redis.error_reply('ERR herald claim: bad arguments')
end
local now = ms_now()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', fmt(now), 'LIMIT', 0, n)
if #due == 0 then return {'', due} end
local claim = fmt(now + claim_ms) .. '.5'
for _, ch in ipairs(due) do redis.call('ZADD', KEYS[1], claim, ch) end
return {claim, due}
