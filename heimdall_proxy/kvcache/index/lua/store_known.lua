-- ARGV: prefix, pod, bit offset, engine hashes blob (a location-only event)
local p = ARGV[1]
local emap = p .. 'e:' .. ARGV[2]
local off = tonumber(ARGV[3])
local ehs = ARGV[4]
local n = 0
for i = 1, #ehs, 8 do
  local mine = redis.call('HGET', emap, string.sub(ehs, i, i + 7))
  if mine then
    for j = 1, #mine, 8 do
      redis.call('SETBIT', p .. 'b:' .. string.sub(mine, j, j + 7), off, 1)
      n = n + 1
    end
  end
end
return n
