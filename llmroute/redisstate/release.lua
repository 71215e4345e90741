-- Release one slot and one unit of capacity claimed by claim.lua, then wake
-- the queues of every instance.
-- KEYS: upstream hash, provider hash; ARGV: instance, wake channel
for i = 1, 2 do
  local n = redis.call('HINCRBY', KEYS[i], ARGV[1], -1)
  if n <= 0 then redis.call('HDEL', KEYS[i], ARGV[1]) end
end
redis.call('PUBLISH', ARGV[2], 'release')
return 1
