-- Claim one slot of an upstream and one unit of its provider's capacity,
-- both or neither. Each instance's holding is a count in a hash (field =
-- instance id) with a lease expiry in a sorted set; expired instances (a
-- crashed process that stopped renewing) are dropped before counting.
-- Time is the server's, so instances' clocks do not matter.
-- KEYS: upstream hash, upstream leases, provider hash, provider leases
-- ARGV: instance, lease ttl (ms), upstream limit (-1 none), capacity (-1 none)
-- Returns 1 claimed, 0 upstream full, -1 provider full.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function used(h, z)
  local dead = redis.call('ZRANGEBYSCORE', z, '-inf', now)
  if #dead > 0 then
    redis.call('HDEL', h, unpack(dead))
    redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
  end
  local n = 0
  for _, v in ipairs(redis.call('HVALS', h)) do n = n + tonumber(v) end
  return n
end
local ttl = tonumber(ARGV[2])
local limit, cap = tonumber(ARGV[3]), tonumber(ARGV[4])
local up = used(KEYS[1], KEYS[2])
if limit >= 0 and up >= limit then return 0 end
local pv = used(KEYS[3], KEYS[4])
if cap >= 0 and pv >= cap then return -1 end
for i = 1, 3, 2 do
  redis.call('HINCRBY', KEYS[i], ARGV[1], 1)
  redis.call('ZADD', KEYS[i + 1], now + ttl, ARGV[1])
  redis.call('PEXPIRE', KEYS[i], 2 * ttl)
  redis.call('PEXPIRE', KEYS[i + 1], 2 * ttl)
end
return 1
