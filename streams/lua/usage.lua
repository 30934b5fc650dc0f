-- Fair admission's view of the fleet (streams/fair_share.py), one round trip per tick.
-- KEYS[1]: every tenant's recent calls, a hash: tenant -> "<judged/s> <admitted/s> <Redis time
--          ms>", rates exponentially weighted averages over ARGV[1] ms (decayed when read).
-- KEYS[2]: the lane stages' queueing delays (runtime/load.py): worker -> "<ms> <time ms>".
-- ARGV[1]: the average's time constant (ms); ARGV[2]: how old a delay report may be (ms);
-- ARGV[3]: the rate below which a tenant is not active (calls/s); ARGV[4], ARGV[5], ...:
-- triples of (tenant, calls this worker judged, and admitted, since its last tick).
-- Returns: the largest fresh delay (ms), then (tenant, judged/s, admitted/s) for each active
-- tenant.
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local tau = tonumber(ARGV[1])
local fresh = tonumber(ARGV[2])
local active = tonumber(ARGV[3])

-- A value's two rates, decayed to now.
local function decayed(value)
  local judged, admitted, at = string.match(value, '^(%S+) (%S+) (%S+)$')
  judged, admitted, at = tonumber(judged), tonumber(admitted), tonumber(at)
  if judged == nil or admitted == nil or at == nil then return 0, 0 end
  local age = ms - at
  if age <= 0 then return judged, admitted end
  local kept = math.exp(-age / tau)
  return judged * kept, admitted * kept
end

local function g(x) return string.format('%.6g', x) end

for i = 4, #ARGV - 2, 3 do
  local before = redis.call('HGET', KEYS[1], ARGV[i])
  local judged, admitted = 0, 0
  if before then judged, admitted = decayed(before) end
  judged = judged + tonumber(ARGV[i + 1]) * 1000 / tau
  admitted = admitted + tonumber(ARGV[i + 2]) * 1000 / tau
  redis.call('HSET', KEYS[1], ARGV[i], g(judged) .. ' ' .. g(admitted) .. ' ' .. ms)
end
if #ARGV > 3 then redis.call('PEXPIRE', KEYS[1], 60000) end

local out = {'0'}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local judged, admitted = decayed(all[i + 1])
  if judged >= active then
    out[#out + 1] = all[i]
    out[#out + 1] = g(judged)
    out[#out + 1] = g(admitted)
  elseif judged < active / 100 then
    redis.call('HDEL', KEYS[1], all[i])
  end
end

local worst = 0
local loads = redis.call('HGETALL', KEYS[2])
for i = 1, #loads, 2 do
  local delay, at = string.match(loads[i + 1], '^(%S+) (%S+)$')
  delay, at = tonumber(delay), tonumber(at)
  if delay ~= nil and at ~= nil and ms - at <= fresh then
    if delay > worst then worst = delay end
  elseif at == nil or ms - at > 60000 then
    redis.call('HDEL', KEYS[2], loads[i])
  end
end
out[1] = string.format('%.1f', worst)
return out
