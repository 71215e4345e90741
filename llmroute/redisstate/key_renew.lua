-- Renew the leases of the reservations an instance still holds (XX: one
-- that expired and was dropped stays dropped, its reservation is gone).
-- KEYS: a holds set per lease; ARGV: lease ttl (ms), then the members.
local expiry = now_ms() + tonumber(ARGV[1])
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], 'XX', expiry, ARGV[i + 1])
end
return 1
