-- Release the concurrency slots of calls that ended (streams/limiter.py).
-- KEYS: the calls' decision marks; ARGV: the calls' ids, in the same order.
-- Idempotent: a slot already released (or expired) is simply not there.
local released = 0
for i = 1, #KEYS do
  local seen = redis.call('GET', KEYS[i])
  if seen then
    local first = true
    for word in string.gmatch(seen, '%S+') do
      if first then
        first = false
      else
        released = released + redis.call('ZREM', word, ARGV[i])
      end
    end
  end
end
return released
