-- Fleet admission for one batch of calls (streams/limiter.py), in one round trip.
-- KEYS: the batch's buckets (a hash {t, ts} per rate bucket, a sorted set of the calls
--   holding a slot per concurrency bucket).
-- ARGV: nb, max_retry_after_s, lease_s, mark prefix, then per bucket (kind 'r'|'c',
--   rate|slots, burst), then the plan: runs of calls drawing from the same buckets, as one
--   string of numbers "count m i1..im count m i1..im ...", then the calls' ids, in order, as
--   one string separated by spaces (a call id holds no space). Two strings rather than a few
--   arguments per call: packing the arguments was most of the client's cost per call.
-- Each call's decision mark is the key <mark prefix><call id>: named here, not among KEYS,
--   so admission needs a standalone (or Sentinel-managed) Redis, not Redis Cluster.
-- Returns, per call: 0 admitted, else the advised wait in milliseconds.
-- A call seen before (a redelivered batch) gets the answer it got then, drawing nothing.
-- Redis' own clock decides, so workers' clocks do not matter.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local nb = tonumber(ARGV[1])
local max_after = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
local mark_prefix = ARGV[4]
local kind, lim, cap, tokens, waiting = {}, {}, {}, {}, {}
local a = 5
for b = 1, nb do
  kind[b] = ARGV[a]
  lim[b] = tonumber(ARGV[a + 1])
  cap[b] = tonumber(ARGV[a + 2])
  a = a + 3
  waiting[b] = 0
  if kind[b] == 'r' then
    local st = redis.call('HMGET', KEYS[b], 't', 'ts')
    local tk, ts = tonumber(st[1]), tonumber(st[2])
    if tk == nil or ts == nil then
      tk, ts = cap[b], now
    end
    tokens[b] = math.min(cap[b], tk + math.max(0, now - ts) * lim[b])
  else
    redis.call('ZREMRANGEBYSCORE', KEYS[b], '-inf', now)
    tokens[b] = lim[b] - redis.call('ZCARD', KEYS[b])
  end
end
local plan = {}
for word in string.gmatch(ARGV[a], '%S+') do
  table.insert(plan, tonumber(word))
end
local ids = string.gmatch(ARGV[a + 1], '%S+')
local out = {}
local c = 0
local p = 1
while p <= #plan do
  local count, m = plan[p], plan[p + 1]
  local drawn = {}
  for j = 1, m do
    drawn[j] = plan[p + 1 + j]
  end
  p = p + 2 + m
  for _ = 1, count do
    local call_id = ids()
    c = c + 1
    local mark = mark_prefix .. call_id
    local seen = redis.call('GET', mark)
    if seen then
      out[c] = tonumber(string.match(seen, '^%S+'))
    else
      local after = 0
      for j = 1, m do
        local b = drawn[j]
        if tokens[b] < 1 then
          local w = 1 -- a slot frees when a call ends: no better advice than a second
          if kind[b] == 'r' then
            w = (1 + waiting[b] - tokens[b]) / lim[b]
          end
          if w > after then after = w end
        end
      end
      if after == 0 then
        local slots = {}
        for j = 1, m do
          local b = drawn[j]
          tokens[b] = tokens[b] - 1
          if kind[b] == 'c' then
            redis.call('ZADD', KEYS[b], now + lease, call_id)
            table.insert(slots, KEYS[b])
          end
        end
        redis.call('SET', mark, '0 ' .. table.concat(slots, ' '), 'EX', lease)
        out[c] = 0
      else
        for j = 1, m do
          local b = drawn[j]
          if tokens[b] < 1 then waiting[b] = waiting[b] + 1 end
        end
        local ms = math.max(1, math.ceil(math.min(after, max_after) * 1000))
        redis.call('SET', mark, tostring(ms), 'EX', lease)
        out[c] = ms
      end
    end
  end
end
for b = 1, nb do
  if kind[b] == 'r' then
    redis.call('HSET', KEYS[b], 't', string.format('%.6f', tokens[b]), 'ts', string.format('%.6f', now))
    redis.call('PEXPIRE', KEYS[b], math.ceil(cap[b] / lim[b] * 1000) + 1000)
  else
    redis.call('PEXPIRE', KEYS[b], lease * 1000)
  end
end
return out
