-- KEYS: presence, presence_exp, presence_keys, presence_gone, presence_gone_exp, meta
-- ARGV: member_key, token
if ARGV[1] == '' or not string.match(ARGV[2], '^%d+$') then
  return redis.error_reply('ERR herald leave: bad arguments')
end
local rec = redis.call('HGET', KEYS[1], ARGV[1])
if rec and string.match(rec, '^(%d+) ') ~= ARGV[2] then return {'none'} end
if not rec then
  if not is_closed(KEYS[6]) then gone_note(KEYS[4], KEYS[5], ARGV[1], ARGV[2], true, ms_now()) end
  return {'none'}
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
gone_note(KEYS[4], KEYS[5], ARGV[1], ARGV[2], true, ms_now())
return {'left', rec}
