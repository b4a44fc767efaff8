-- Publish this replica's per-pod totals and return every other live replica's.
-- KEYS[1]  sorted set: replica id -> last publish time (ms, the server's clock)
-- ARGV[1]  prefix of the per-replica hashes (the replica id is appended)
-- ARGV[2]  this replica's id
-- ARGV[3]  time to live of a replica's entries (ms): a replica that stops publishing is gone
-- ARGV[4..] pod, value, pod, value, ...
-- Returns pod, value, pod, value, ... over the other replicas (a pod may repeat).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
local mine = ARGV[1] .. ARGV[2]
redis.call('DEL', mine)
if #ARGV > 3 then
  redis.call('HSET', mine, unpack(ARGV, 4))
  redis.call('PEXPIRE', mine, ttl)
end
redis.call('ZADD', KEYS[1], now, ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('PEXPIRE', KEYS[1], ttl)
local out = {}
for _, r in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if r ~= ARGV[2] then
    local h = redis.call('HGETALL', ARGV[1] .. r)
    for i = 1, #h do out[#out + 1] = h[i] end
  end
end
return out
