-- KEYS: meta, log, sched, sched_idx, claims
-- ARGV: id, token, durable,
--   epoch, max_len, max_age_ms, head, tail, id, channel, fan, publish
local ev = event_args(4)
if not ev then return redis.error_reply('ERR herald deliver: bad arguments') end
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 0 then return {'stale'} end
local cur = redis.call('HGET', KEYS[5], ARGV[1])
if not cur or string.match(cur, '^(%d+) ') ~= ARGV[2] then return {'stale'} end
local m = meta_of(KEYS[1])
if m[4] == '1' then return {'closed'} end
ev.durable, ev.closes = ARGV[3] == '1', false
local err, sseq, sts, sepoch, lost = append_msg(KEYS[1], KEYS[2], ev, m, ms_now())
if err then return err end
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
return {'ok', sseq, sts, sepoch, lost}
