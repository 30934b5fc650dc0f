-- Fleet admission for one batch of calls (streams/limiter.py), in one round trip.
-- KEYS: the batch's buckets (a hash {t, ts} per rate bucket, a sorted set of the calls
--   holding a slot per concurrency bucket).
-- ARGV: nb, max_retry_after_s, lease_s, mark prefix, this worker's id, the fair-share
--   window in seconds (0: off), then per bucket (kind 'r'|'c', rate|slots, burst), then the
--   plan: runs of calls drawing from the same buckets, as one
--   string of numbers "count m i1..im count m i1..im ...", then the calls' ids, in order, as
--   one string separated by spaces (a call id holds no space). Two strings rather than a few
--   arguments per call: packing the arguments was most of the client's cost per call.
-- Each call's decision mark is the key <mark prefix><call id>: named here, not among KEYS,
--   so admission needs a standalone (or Sentinel-managed) Redis, not Redis Cluster.
-- Returns, per call: 0 admitted, else the advised wait in milliseconds.
-- A call seen before (a redelivered batch) gets the answer it got then, drawing nothing.
-- Redis' own clock decides, so workers' clocks do not matter.
-- Fair shares across workers: a rate bucket's hash also holds, per worker that drew from it,
--   its last ask (l:<id>) and its credit (c:<id>), which refills at rate / W, W the workers
--   that asked within the window, up to max(1, burst / W). A worker draws on its credit; it
--   draws beyond it only the tokens the other workers' credits do not claim: the first to
--   ask after a refill no longer takes all of it, and a share left unused is not lost.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local nb = tonumber(ARGV[1])
local max_after = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
local mark_prefix = ARGV[4]
local me = ARGV[5]
local window = tonumber(ARGV[6])
local kind, lim, cap, tokens, waiting, credit, workers, owed = {}, {}, {}, {}, {}, {}, {}, {}
local a = 7
for b = 1, nb do
  kind[b] = ARGV[a]
  lim[b] = tonumber(ARGV[a + 1])
  cap[b] = tonumber(ARGV[a + 2])
  a = a + 3
  waiting[b] = 0
  workers[b] = 1
  owed[b] = 0
  if kind[b] == 'r' then
    local st = redis.call('HMGET', KEYS[b], 't', 'ts', 'c:' .. me, 'l:' .. me)
    local tk, ts = tonumber(st[1]), tonumber(st[2])
    if tk == nil or ts == nil then
      tk, ts = cap[b], now
    end
    tokens[b] = math.min(cap[b], tk + math.max(0, now - ts) * lim[b])
    if window > 0 then
      local fields = redis.call('HGETALL', KEYS[b])
      local value, others = {}, {}
      for i = 1, #fields, 2 do
        value[fields[i]] = fields[i + 1]
      end
      for f, v in pairs(value) do
        if string.sub(f, 1, 2) == 'l:' and f ~= 'l:' .. me then
          local last = tonumber(v) or 0
          local id = string.sub(f, 3)
          if last >= now - window then
            workers[b] = workers[b] + 1
            table.insert(others, {tonumber(value['c:' .. id]) or 0, last})
          elseif last < now - 10 * window then
            redis.call('HDEL', KEYS[b], f, 'c:' .. id)
          end
        end
      end
      local most = math.max(1, cap[b] / workers[b])
      for _, o in ipairs(others) do
        owed[b] = owed[b] + math.min(most, o[1] + math.max(0, now - o[2]) * lim[b] / workers[b])
      end
      local mine, since = tonumber(st[3]), tonumber(st[4])
      if mine == nil or since == nil then
        credit[b] = most
      else
        credit[b] = math.min(most, mine + math.max(0, now - since) * lim[b] / workers[b])
      end
    end
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
        elseif credit[b] ~= nil and credit[b] < 1 and tokens[b] - owed[b] < 1 then
          -- this worker has taken its share; what is left is the others'
          local w = (1 - credit[b]) * workers[b] / lim[b]
          if w > after then after = w end
        end
      end
      if after == 0 then
        local slots = {}
        for j = 1, m do
          local b = drawn[j]
          tokens[b] = tokens[b] - 1
          if credit[b] ~= nil then credit[b] = math.max(0, credit[b] - 1) end
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
    if credit[b] ~= nil then
      redis.call('HSET', KEYS[b], 'c:' .. me, string.format('%.6f', credit[b]), 'l:' .. me, string.format('%.6f', now))
    end
    redis.call('PEXPIRE', KEYS[b], math.ceil(cap[b] / lim[b] * 1000) + 1000)
  else
    redis.call('PEXPIRE', KEYS[b], lease * 1000)
  end
end
return out
