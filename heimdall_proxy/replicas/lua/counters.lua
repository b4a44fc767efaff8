-- Publish this replica's per-pod totals and return every other live replica's, for one or
-- more sets of counters (one per plugin sharing its counts) in one call.
-- KEYS[g]  set g's sorted set: replica id -> last publish time (ms, the server's clock)
-- ARGV, per set g in KEYS order:
--   prefix of the per-replica hashes (the replica id is appended), this replica's id,
--   time to live of a replica's entries (ms: a replica that stops publishing is gone),
--   n, then n pairs pod, value
-- Returns one array per set: for each other live replica, its id, the length of its
-- hash's flattened field/value list, then that list (pod, value, ...; the field "\0seq"
-- carries the replica's publish sequence number).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local result = {}
local a = 1
for g = 1, #KEYS do
  local prefix, me, ttl, n = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local mine = prefix .. me
  redis.call('DEL', mine)
  if n > 0 then
    redis.call('HSET', mine, unpack(ARGV, a + 4, a + 3 + 2 * n))
    redis.call('PEXPIRE', mine, ttl)
  end
  a = a + 4 + 2 * n
  redis.call('ZADD', KEYS[g], now, me)
  redis.call('ZREMRANGEBYSCORE', KEYS[g], '-inf', now - ttl)
  redis.call('PEXPIRE', KEYS[g], ttl)
  local out = {}
  for _, r in ipairs(redis.call('ZRANGE', KEYS[g], 0, -1)) do
    if r ~= me then
      local h = redis.call('HGETALL', prefix .. r)
      out[#out + 1] = r
      out[#out + 1] = #h
      for i = 1, #h do out[#out + 1] = h[i] end
    end
  end
  result[g] = out
end
return result
