-- KEYS: meta, cursors
-- ARGV: subscriber, seq, indexed
local seq = tonumber(ARGV[2])
if not seq or seq < 0 or ARGV[1] == '' then
  return redis.error_reply('ERR herald ack: bad arguments')
end
local head = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
if seq > head then return {'beyond', fmt(head)} end
local cur = redis.call('HGET', KEYS[2], ARGV[1])
local at = 0
if cur then
  local cs, ct = string.match(cur, '^(%d+):(%d+)$')
  if cs and tonumber(cs) >= seq then return {'ok', cs, ct} end
  if ct then at = tonumber(ct) end
elseif ARGV[3] ~= '1' then
  return {'index'}
end
local now = ms_now()
if at > now then now = at end
redis.call('HSET', KEYS[2], ARGV[1], fmt(seq) .. ':' .. fmt(now))
return {'ok', fmt(seq), fmt(now)}
