-- Keys travel as blobs of 8-byte big-endian values (one argument per event, not per block),
-- and are used as the binary suffix of Redis key names.
--
-- ARGV: prefix, pod, bit offset, name width, blocks per engine block, engine hashes blob,
-- keys blob, block-key names blob (every name `width` bytes: the client builds them, so the
-- script slices blobs with one struct.unpack instead of a string operation per block)
local emap = ARGV[1] .. 'e:' .. ARGV[2]
local off = tonumber(ARGV[3])
local width = tonumber(ARGV[4])
local per = tonumber(ARGV[5]) * 8
local ehs, keys, names = ARGV[6], ARGV[7], ARGV[8]
local n = #ehs / 8
local e = {struct.unpack(string.rep('c8', n), ehs)}
local k = {struct.unpack(string.rep('c' .. per, n), keys)}
local pairs = {}
for i = 1, n do
  pairs[#pairs + 1] = e[i]
  pairs[#pairs + 1] = k[i]
end
redis.call('HSET', emap, unpack(pairs))
local m = #names / width
local nm = {struct.unpack(string.rep('c' .. width, m), names)}
for i = 1, m do redis.call('SETBIT', nm[i], off, 1) end
return 0
