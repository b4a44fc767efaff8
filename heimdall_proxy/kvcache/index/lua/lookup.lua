-- ARGV: name width, bitmap width, block-key names blob, speculative-key names blob (or "")
-- -> {bitmaps, speculative bitmaps}, each bitmap cut or zero-padded to the bitmap width.
-- Stops at the first block nobody holds, reading blocks 8 then 256 at a time, so a cold
-- prompt costs one small MGET.
local width = tonumber(ARGV[1])
local w = tonumber(ARGV[2])
local names, snames = ARGV[3], ARGV[4]
local n = #names / width
local zero = string.rep('\0', w)
local out, sout = {}, {}
local function fit(v)
  local len = #v
  if len < w then return v .. string.sub(zero, len + 1) end
  return string.sub(v, 1, w)
end
local i, step = 0, 8
while i < n do
  local cnt = math.min(step, n - i)
  local fmt = string.rep('c' .. width, cnt)
  local nm = {struct.unpack(fmt, names, i * width + 1)}
  nm[#nm] = nil
  local vals = redis.call('MGET', unpack(nm))
  local specs = nil
  if #snames > 0 then
    local sn = {struct.unpack(fmt, snames, i * width + 1)}
    sn[#sn] = nil
    specs = redis.call('MGET', unpack(sn))
  end
  for k = 1, cnt do
    local v = vals[k]
    if specs then
      local sv = specs[k]
      if not v and not sv then return {table.concat(out), table.concat(sout)} end
      if not sv then sv = zero elseif #sv ~= w then sv = fit(sv) end
      sout[i + k] = sv
    elseif not v then
      return {table.concat(out), ''}
    end
    if not v then v = zero elseif #v ~= w then v = fit(v) end
    out[i + k] = v
  end
  i = i + cnt
  step = 256
end
return {table.concat(out), table.concat(sout)}
