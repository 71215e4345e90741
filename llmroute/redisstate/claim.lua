-- Claim up to k slots of an upstream, each with one unit of its provider's
-- capacity (both or neither per slot), as k claims one after the other
-- would: the batcher merges the claims queued together for one pair into
-- one call. Each instance's holding is a count in a hash (field = instance
-- id) with a lease expiry in a sorted set; expired instances (a crashed
-- process that stopped renewing) are dropped before counting. Time is the
-- server's, so instances' clocks do not matter.
-- KEYS: upstream hash, upstream leases, provider hash, provider leases
-- ARGV: instance, lease ttl (ms), upstream limit (-1 none), capacity (-1 none), k
-- Returns {granted, reason}: reason (0 upstream full, -1 provider full) is
-- why claim number granted + 1 was refused, when granted < k.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me = ARGV[1]
-- used returns the live count and whether this instance has a field. A
-- field never exists without a live lease beside it: a lease is written
-- whenever a field is created, and both are dropped together at expiry
-- (below) or by a renewal of 0.
local function used(h, z)
  local dead = redis.call('ZRANGEBYSCORE', z, '-inf', now)
  if #dead > 0 then
    redis.call('HDEL', h, unpack(dead))
    redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
  end
  local n, mine = 0, false
  local kv = redis.call('HGETALL', h)
  for i = 1, #kv, 2 do
    n = n + tonumber(kv[i + 1])
    if kv[i] == me then mine = true end
  end
  return n, mine
end
local ttl = tonumber(ARGV[2])
local limit, cap, k = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local g, reason = k, 0
local up, upMine = used(KEYS[1], KEYS[2])
if limit >= 0 and limit - up < g then g = math.max(0, limit - up) end
if g == 0 then return {0, 0} end
local pv, pvMine = used(KEYS[3], KEYS[4])
if cap >= 0 and cap - pv < g then g = math.max(0, cap - pv); reason = -1 end
if g == 0 then return {0, -1} end
local mine = {upMine, pvMine}
for j = 1, 2 do
  local i = 2 * j - 1
  redis.call('HINCRBY', KEYS[i], me, g)
  -- An instance that has a field here has a live lease, which its
  -- renewals push on every third of the ttl (with the keys' expiry): the
  -- claim leaves both alone. Otherwise it writes its lease and pushes the
  -- keys' expiry on, which thus always outlives every lease by a ttl
  -- (every write of a lease or of an expiry does both, and no lease is
  -- later than now + ttl).
  if not mine[j] then
    redis.call('ZADD', KEYS[i + 1], now + ttl, me)
    redis.call('PEXPIRE', KEYS[i], 2 * ttl)
    redis.call('PEXPIRE', KEYS[i + 1], 2 * ttl)
  end
end
return {g, reason}
