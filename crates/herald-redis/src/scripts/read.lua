-- KEYS: meta, log
-- ARGV: epoch, after, limit
local after, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
if not (after and limit) or after < 0 or limit < 0 then
  return redis.error_reply('ERR herald read: bad arguments')
end
local epoch, head, lost = ensure_meta(KEYS[1], KEYS[2], ARGV[1])
local first = first_of(KEYS[2], head)
local entries = {}
if limit > 0 and after < head then
  entries = redis.call('XRANGE', KEYS[2], fmt(after + 1) .. '-0', fmt(head) .. '-0', 'COUNT', fmt(limit))
end
local closed = 0
if is_closed(KEYS[1]) then closed = 1 end
return {epoch, fmt(head), fmt(first), lost, entries, closed}
