-- Helpers shared by the scripts, pasted after the shebang of each one.
local function fmt(n) return string.format('%d', n) end
-- An epoch as the scripts' replies and payloads carry it: '-' for none
-- (nil, a missing field's false, or empty).
local function or_dash(s)
  if not s or s == '' then return '-' end
  return s
end
-- Whether `s` is a count in canonical decimal (passed on to Redis as it
-- is, and compared with '0' as text).
local function is_count(s) return s == '0' or string.find(s, '^[1-9]%d*$') ~= nil end
local function ms_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function seq_of(id) return tonumber(string.match(id, '^(%d+)%-')) end
-- The last seq the stream ever held (its last generated id); nil without a stream.
local function stream_last(log)
  if redis.call('EXISTS', log) == 0 then return nil end
  local info = redis.call('XINFO', 'STREAM', log)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then return seq_of(info[i + 1]) end
  end
  return nil
end
-- The channel's epoch and head. Creates the meta of a channel never seen,
-- in a new epoch. lost = 1 when the meta was missing but the stream was
-- not: Redis lost the meta; the log goes on after its last seq, in a new
-- epoch, so clients holding old seqs resync. The new meta's `exp` is the
-- stream's expiry as Redis has it (absent: none), so appends go on
-- trusting `exp` whoever recreated the meta.
local function ensure_meta(meta, log, new_epoch)
  local m = redis.call('HMGET', meta, 'epoch', 'seq')
  if m[1] then return m[1], tonumber(m[2] or '0'), 0 end
  local head, lost = 0, 0
  local last = stream_last(log)
  if last then head, lost = last, 1 end
  local ttl = last and redis.call('PTTL', log) or -1
  if ttl >= 0 then
    redis.call('HSET', meta, 'epoch', new_epoch, 'seq', fmt(head), 'exp', fmt(ms_now() + ttl))
  else
    redis.call('HSET', meta, 'epoch', new_epoch, 'seq', fmt(head))
  end
  return new_epoch, head, lost
end
local function first_of(log, head)
  local f = redis.call('XRANGE', log, '-', '+', 'COUNT', 1)
  if f[1] then return seq_of(f[1][1]) end
  return head + 1
end
local function is_closed(meta) return redis.call('HGET', meta, 'closed') == '1' end
-- The arguments of the one message ROOM_WRITE and SCHED_DELIVER append
-- (`Event` in args.rs), from ARGV[b]: epoch, max_len, max_age_ms, head,
-- tail, id, channel, fan, publish (a durable frame's middle is built from
-- the id, see frame_of; a volatile frame's head runs up to its ts).
-- Returns them as append_msg's table (durable and closes left to the
-- caller), or nil when malformed.
local function event_args(b)
  local max_len, max_age = ARGV[b + 1], tonumber(ARGV[b + 2])
  if not is_count(max_len) or not max_age or max_age < 0 or ARGV[b + 5] == ''
     or (ARGV[b + 8] ~= 'PUBLISH' and ARGV[b + 8] ~= 'SPUBLISH') then
    return nil
  end
  return {
    epoch = ARGV[b], max_len = max_len, max_age = max_age, head = ARGV[b + 3], tail = ARGV[b + 4],
    id = ARGV[b + 5], channel = ARGV[b + 6], fan = ARGV[b + 7], publish = ARGV[b + 8],
  }
end
-- Publish a volatile message (no seq, never closes) on its fan-out
-- channel: the frame is not stored, so it is built inside the payload.
-- `head` is the frame up to its ts (it has no seq).
local function publish_volatile(publish, fan, channel, sts, id, sepoch, head, tail)
  redis.call(publish, fan, 'v2 ' .. channel .. ' - ' .. sts .. ' ' .. id .. ' ' .. sepoch .. ' 0\n' .. head .. sts .. tail)
end
-- The meta fields append_msg reads, in its order (one HMGET).
local function meta_of(meta) return redis.call('HMGET', meta, 'epoch', 'seq', 'ts', 'closed', 'oldest', 'exp') end
-- XADD of one entry, id `<seq>-0`, trimmed to max_len (text; '0': no
-- limit). pcall: the caller handles a stream ahead of the meta.
local function xadd_entry(log, max_len, sseq, sts, id, frame)
  if max_len ~= '0' then
    return redis.pcall('XADD', log, 'MAXLEN', '=', max_len, sseq .. '-0', 't', sts, 'i', id, 'f', frame)
  end
  return redis.pcall('XADD', log, sseq .. '-0', 't', sts, 'i', id, 'f', frame)
end
-- A durable message's frame: its head, seq, the middle (`,"id":"<id>","ts":`,
-- built from the id, which needs no JSON escaping), ts and tail.
local function frame_of(a, sseq, sts)
  return a.head .. sseq .. ',"id":"' .. a.id .. '","ts":' .. sts .. a.tail
end
-- How long past max_age a log may outlive its last append, so that its
-- expiry is set again only once in that long (at most a minute).
local function expiry_slack(max_age) return math.min(math.floor(max_age / 8), 60000) end
-- Append one message to the channel and publish it on its fan-out channel:
-- the common part of APPEND, ROOM_WRITE and SCHED_DELIVER. `a` holds
-- durable, closes, epoch (a fresh one, used if the channel has none),
-- max_len (text, as is_count checked it; '0': no limit), max_age, the
-- frame's head (a volatile one's up to its ts) and tail, id, channel,
-- fan, publish. `m` is the channel's meta as meta_of read it (before any write
-- since), `now` the time in ms (one TIME per script run) and `now_s` the
-- same as text (or nil). Returns nil, sseq, sts (the ts as text), sepoch,
-- lost; or an error reply (and nothing else) before any write of its own but
-- ensure_meta's.
--
-- The meta's `oldest` is a lower bound of the ts of the log's first entry
-- (entries leave only from the front, and a meta's ts never goes down), so
-- while it is within max_age no entry can be old enough to trim, and the
-- log is not read.
local function append_msg(meta, log, a, m, now, now_s)
  local ts = now
  local epoch, seq, lost, frame, sts, sseq = '', nil, 0, nil, nil, '-'
  if a.durable then
    local head, oldest, was_oldest, was_epoch, new_exp
    if m[1] then
      epoch, head, oldest = m[1], tonumber(m[2] or '0'), tonumber(m[5] or '')
      was_oldest, was_epoch = oldest, epoch
      local last_ts = tonumber(m[3] or '0')
      if last_ts > ts then ts = last_ts end
    else
      epoch, head, lost = ensure_meta(meta, log, a.epoch)
      was_epoch = epoch
    end
    seq = head + 1
    if ts == now and now_s then sts = now_s else sts = fmt(ts) end
    sseq = fmt(seq)
    frame = frame_of(a, sseq, sts)
    local added = xadd_entry(log, a.max_len, sseq, sts, a.id, frame)
    if type(added) == 'table' and added.err then
      -- The stream is ahead of the meta (Redis lost part of the meta): go on
      -- after the stream's last seq, in a new epoch.
      local last = stream_last(log)
      if not last or last < seq then return added end
      seq, epoch, lost, oldest = last + 1, a.epoch, 1, nil
      sseq = fmt(seq)
      frame = frame_of(a, sseq, sts)
      added = xadd_entry(log, a.max_len, sseq, sts, a.id, frame)
      if type(added) == 'table' and added.err then return added end
    end
    if a.max_age > 0 then
      local cutoff = ts - a.max_age
      if not oldest or oldest < cutoff then
        -- Messages older than max_age go. The log is ordered by ts and
        -- gap-free, so a binary search finds the first one to keep; the
        -- message just added is always kept.
        local function ts_of(s)
          local e = redis.call('XRANGE', log, fmt(s) .. '-0', fmt(s) .. '-0')
          if e[1] then return tonumber(e[1][2][2]) end
          return -1
        end
        local f = redis.call('XRANGE', log, '-', '+', 'COUNT', 1)
        oldest = ts
        if f[1] then
          oldest = tonumber(f[1][2][2])
          if oldest < cutoff then
            local lo, hi = seq_of(f[1][1]), seq
            while hi - lo > 1 do
              local mid = math.floor((lo + hi) / 2)
              if ts_of(mid) < cutoff then lo = mid else hi = mid end
            end
            redis.call('XTRIM', log, 'MINID', fmt(hi) .. '-0')
            oldest = ts_of(hi)
          end
        end
      end
    end
    -- A channel idle for max_age has nothing left to keep: the log expires
    -- at `exp`, between max_age and max_age + expiry_slack(max_age) after
    -- its last append. The meta's `exp` says when (absent: no expiry set);
    -- it is trusted unless the meta was lost (`lost`).
    local exp = m[6]
    if lost ~= 0 then exp = nil end
    if a.max_age > 0 then
      if not exp or tonumber(exp) - now < a.max_age then
        new_exp = fmt(now + a.max_age + expiry_slack(a.max_age))
        redis.call('PEXPIREAT', log, new_exp)
      end
    elseif exp ~= false then
      redis.call('PERSIST', log)
      redis.call('HDEL', meta, 'exp')
    end
    -- Only what changed: the epoch and `oldest` rarely do.
    if epoch ~= was_epoch then
      redis.call('HSET', meta, 'epoch', epoch)
    end
    if new_exp then
      redis.call('HSET', meta, 'exp', new_exp)
    end
    if oldest and oldest ~= was_oldest then
      redis.call('HSET', meta, 'seq', sseq, 'ts', sts, 'oldest', fmt(oldest))
    else
      redis.call('HSET', meta, 'seq', sseq, 'ts', sts)
    end
    if a.closes then redis.call('HSET', meta, 'closed', '1') end
  else
    epoch = m[1] or ''
    sts = now_s or fmt(ts)
  end
  local sepoch = or_dash(epoch)
  local closes = '0'
  if seq and a.closes then closes = '1' end
  if frame then
    redis.call(a.publish, a.fan, 'v2 ' .. a.channel .. ' ' .. sseq .. ' ' .. sts .. ' ' .. a.id .. ' '
      .. sepoch .. ' ' .. closes .. '\n' .. frame)
  else
    publish_volatile(a.publish, a.fan, a.channel, sts, a.id, sepoch, a.head, a.tail)
  end
  return nil, sseq, sts, sepoch, lost
end
