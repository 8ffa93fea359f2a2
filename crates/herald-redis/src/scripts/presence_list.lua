-- KEYS: presence, presence_exp, presence_keys
-- ARGV: limit
local limit = tonumber(ARGV[1])
if not limit or limit < 0 then return redis.error_reply('ERR herald presence: bad arguments') end
local now = ms_now()
local out = {}
local from = '-'
while #out < limit do
  local ks = redis.call('ZRANGEBYLEX', KEYS[3], from, '+', 'LIMIT', 0, 256)
  if #ks == 0 then break end
  local recs = redis.call('HMGET', KEYS[1], unpack(ks))
  for i = 1, #ks do
    local r = recs[i]
    if r and #out < limit then
      local exp = tonumber(string.match(r, '^%d+ (%d+) '))
      if exp and exp > now then out[#out + 1] = r end
    end
  end
  if #ks < 256 then break end
  from = '(' .. ks[#ks]
end
return out
