-- Helpers of the presence scripts that remember removed leases (presence:gone);
-- the placeholders are filled in by scripts/mod.rs (GONE_MEMORY, GONE_CAP).
local function gone_prune(gone, gone_exp, now)
  local due = redis.call('ZRANGEBYSCORE', gone_exp, '-inf', fmt(now), 'LIMIT', 0, 64)
  if #due > 0 then
    redis.call('HDEL', gone, unpack(due))
    redis.call('ZREM', gone_exp, unpack(due))
  end
end
-- Remember that key's lease with token was removed (left: by a leave with
-- it). A removal remembered with a greater token stays; a leave stays.
local function gone_note(gone, gone_exp, key, token, left, now)
  gone_prune(gone, gone_exp, now)
  local cur = redis.call('HGET', gone, key)
  if cur then
    local t, how = string.match(cur, '^(%d+) (%a)$')
    if t and tonumber(t) > tonumber(token) then return end
    if t == token and how == 'l' then left = true end
  end
  local how = 's'
  if left then how = 'l' end
  redis.call('HSET', gone, key, token .. ' ' .. how)
  redis.call('ZADD', gone_exp, fmt(now + ${GONE_MEMORY_MS}), key)
  local n = redis.call('ZCARD', gone_exp)
  if n > ${GONE_CAP} then
    local old = redis.call('ZRANGE', gone_exp, 0, n - ${GONE_CAP} - 1)
    redis.call('HDEL', gone, unpack(old))
    redis.call('ZREM', gone_exp, unpack(old))
  end
end
