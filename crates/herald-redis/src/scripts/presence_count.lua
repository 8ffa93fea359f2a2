return redis.call('ZCOUNT', KEYS[1], '(' .. fmt(ms_now()), '+inf')
