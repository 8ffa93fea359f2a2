-- KEYS: meta, log, room, presence, presence_exp, presence_keys, presence_gone,
--   presence_gone_exp
-- ARGV: expected_version, version, record, closing,
--   epoch, max_len, max_age_ms, head, tail, id, channel, fan, publish
local ev = event_args(5)
if not ev or not tonumber(ARGV[2]) or ARGV[3] == '' or (ARGV[4] ~= '1' and ARGV[4] ~= '0') then
  return redis.error_reply('ERR herald room write: bad arguments')
end
local cur = redis.call('HMGET', KEYS[3], 'version', 'record')
if (ARGV[1] == '' and cur[1]) or (ARGV[1] ~= '' and cur[1] ~= ARGV[1]) then
  return {'conflict', cur[2] or ''}
end
local m = meta_of(KEYS[1])
if m[4] == '1' then return {'closed'} end
local closing = ARGV[4] == '1'
ev.durable, ev.closes = true, closing
local err, sseq, sts, sepoch, lost = append_msg(KEYS[1], KEYS[2], ev, m, ms_now())
if err then return err end
redis.call('HSET', KEYS[3], 'version', ARGV[2], 'record', ARGV[3])
if closing then
  -- No leave is announced for these: the final event says it all. The
  -- token counter stays.
  redis.call('DEL', KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8])
end
return {'ok', sseq, sts, sepoch, lost}
