-- ARGV: bit offset, ttl ms, name width, speculative-key names blob
local off = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local width = tonumber(ARGV[3])
local names = ARGV[4]
local m = #names / width
local nm = {struct.unpack(string.rep('c' .. width, m), names)}
for i = 1, m do
  redis.call('SETBIT', nm[i], off, 1)
  redis.call('PEXPIRE', nm[i], ttl)
end
return 0
