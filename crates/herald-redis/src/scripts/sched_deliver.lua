-- KEYS: meta, log, sched, sched_idx, claims
-- ARGV: id, token, durable,
--   epoch, max_len, max_age_ms, head, middle, tail, id, channel, fan, publish
local max_len, max_age = tonumber(ARGV[5]), tonumber(ARGV[6])
if not (max_len and max_age) or (ARGV[13] ~= 'PUBLISH' and ARGV[13] ~= 'SPUBLISH') or ARGV[10] == '' then
  return redis.error_reply('ERR herald deliver: bad arguments')
end
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 0 then return {'stale'} end
local cur = redis.call('HGET', KEYS[5], ARGV[1])
if not cur or string.match(cur, '^(%d+) ') ~= ARGV[2] then return {'stale'} end
if is_closed(KEYS[1]) then return {'closed'} end
local durable = ARGV[3] == '1'
local r = append_msg(KEYS[1], KEYS[2], {
  durable = durable, closes = false, epoch = ARGV[4], max_len = max_len, max_age = max_age,
  head = ARGV[7], middle = ARGV[8], tail = ARGV[9], id = ARGV[10], channel = ARGV[11],
  fan = ARGV[12], publish = ARGV[13],
})
if r.err then return r.err end
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
return {'ok', r.sseq, fmt(r.ts), r.sepoch, r.lost}
