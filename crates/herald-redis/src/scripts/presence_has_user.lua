-- KEYS: presence_exp, presence_keys
-- ARGV: user_prefix
local now = ms_now()
local from, to = '[' .. ARGV[1], '(' .. ARGV[1] .. '\255'
while true do
  local ks = redis.call('ZRANGEBYLEX', KEYS[2], from, to, 'LIMIT', 0, 64)
  for _, k in ipairs(ks) do
    local s = redis.call('ZSCORE', KEYS[1], k)
    if s and tonumber(s) > now then return 1 end
  end
  if #ks < 64 then return 0 end
  from = '(' .. ks[#ks]
end
