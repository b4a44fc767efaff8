-- ARGV: prefix, pod, pod index, slot, tiers, engine hashes blob -> {removed, unknown}
local p = ARGV[1]
local emap = p .. 'e:' .. ARGV[2]
local tiers = tonumber(ARGV[5])
local base = tonumber(ARGV[3]) * tiers
local slot = tonumber(ARGV[4])
local ehs = ARGV[6]
local removed, unknown = 0, 0
for i = 1, #ehs, 8 do
  local eh = string.sub(ehs, i, i + 7)
  local mine = redis.call('HGET', emap, eh)
  if not mine then
    unknown = unknown + 1
  else
    local held = false
    for j = 1, #mine, 8 do
      local bk = p .. 'b:' .. string.sub(mine, j, j + 7)
      redis.call('SETBIT', bk, base + slot, 0)
      removed = removed + 1
      for t = 0, tiers - 1 do
        if t ~= slot and redis.call('GETBIT', bk, base + t) == 1 then held = true end
      end
      if redis.call('BITCOUNT', bk) == 0 then redis.call('DEL', bk) end
    end
    if not held then redis.call('HDEL', emap, eh) end
  end
end
return {removed, unknown}
