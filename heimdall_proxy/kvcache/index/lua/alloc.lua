-- ARGV: pod -> the pod's index, allocated once (every replica gives a pod the same one)
local i = redis.call('HGET', KEYS[1], ARGV[1])
if i then return tonumber(i) end
i = redis.call('HLEN', KEYS[1])
redis.call('HSET', KEYS[1], ARGV[1], i)
return i
