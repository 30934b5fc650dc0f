-- A worker's queueing delay for fair admission (runtime/load.py, streams/fair_share.py).
-- KEYS[1]: the deployment's load hash. ARGV[1]: the worker's field, ARGV[2]: its delay (ms).
-- The value is "<delay ms> <Redis time ms>": readers judge freshness by Redis' own clock,
-- never by a worker's (clocks across hosts may be skewed).
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. ms)
redis.call('PEXPIRE', KEYS[1], 60000)
return ms
