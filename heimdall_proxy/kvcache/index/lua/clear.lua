-- ARGV: prefix, pod index, tiers, keys blob
local p = ARGV[1]
local tiers = tonumber(ARGV[3])
local base = tonumber(ARGV[2]) * tiers
local keys = ARGV[4]
for i = 1, #keys, 8 do
  local bk = p .. 'b:' .. string.sub(keys, i, i + 7)
  for t = 0, tiers - 1 do redis.call('SETBIT', bk, base + t, 0) end
  if redis.call('BITCOUNT', bk) == 0 then redis.call('DEL', bk) end
end
return 0
