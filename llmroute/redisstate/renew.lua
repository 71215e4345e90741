-- Renew this instance's leases and set its counts to what it really holds:
-- a Redis restart (state lost) or an instance's outage is healed here.
-- KEYS: pairs of (hash, leases) for every upstream and provider
-- ARGV: instance, lease ttl (ms), then one count per pair
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
for i = 1, #KEYS, 2 do
  local n = tonumber(ARGV[2 + (i + 1) / 2])
  if n > 0 then
    redis.call('HSET', KEYS[i], ARGV[1], n)
    redis.call('ZADD', KEYS[i + 1], now + ttl, ARGV[1])
    redis.call('PEXPIRE', KEYS[i], 2 * ttl)
    redis.call('PEXPIRE', KEYS[i + 1], 2 * ttl)
  else
    redis.call('HDEL', KEYS[i], ARGV[1])
    redis.call('ZREM', KEYS[i + 1], ARGV[1])
  end
end
return 1
