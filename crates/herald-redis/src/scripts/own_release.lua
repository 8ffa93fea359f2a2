-- KEYS: owner
-- ARGV: holder
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local sp = string.find(cur, ' ', 1, true)
if string.sub(cur, sp + 1) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
