-- KEYS: meta...
-- ARGV: publish, (channel, fan, id, head, tail)...

-- A run of volatile messages without a receipt (APPEND takes every other
-- kind): one key per message, its channel's meta, and five arguments: its
-- channel, its fan-out channel, its id, and its frame up to its ts (head)
-- and after it (tail). A channel's messages follow one another in order;
-- its meta is read once for them (nothing in the run writes it).
local function bad() return redis.error_reply('ERR herald volatile: bad arguments') end
local ARGV, KEYS = ARGV, KEYS
local publish = ARGV[1]
if publish ~= 'PUBLISH' and publish ~= 'SPUBLISH' then return bad() end
local n, nkeys = #ARGV, #KEYS
if nkeys == 0 or n ~= 1 + 5 * nkeys then return bad() end
for b = 4, n, 5 do
  if ARGV[b] == '' then return bad() end
end
local now_s = fmt(ms_now())
-- One line per message, as APPEND's: `ok - <ts> <epoch|-> 0` or `closed`.
local out = {}
local meta, closed, epoch, ok
local b = 2
for k = 1, nkeys do
  if KEYS[k] ~= meta then
    meta = KEYS[k]
    local v = redis.call('HMGET', meta, 'epoch', 'closed')
    closed, epoch = v[2] == '1', or_dash(v[1])
    ok = 'ok - ' .. now_s .. ' ' .. epoch .. ' 0'
  end
  if closed then
    out[k] = 'closed'
  else
    publish_volatile(publish, ARGV[b + 1], ARGV[b], now_s, ARGV[b + 2], epoch, ARGV[b + 3], ARGV[b + 4])
    out[k] = ok
  end
  b = b + 5
end
return table.concat(out, '\n')
