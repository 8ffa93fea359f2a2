-- KEYS: presence_exp
-- ARGV: none
return redis.call('ZCOUNT', KEYS[1], '(' .. fmt(ms_now()), '+inf')
