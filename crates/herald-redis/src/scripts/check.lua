-- KEYS: meta, log
-- ARGV: seq
local m = redis.call('HMGET', KEYS[1], 'epoch', 'seq')
local id = ''
local s = tonumber(ARGV[1])
if s and s > 0 then
  local e = redis.call('XRANGE', KEYS[2], ARGV[1] .. '-0', ARGV[1] .. '-0')
  if e[1] then id = e[1][2][4] end
end
return {m[1] or '', m[2] or '0', id}
