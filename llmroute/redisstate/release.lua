-- Release one slot and one unit of capacity claimed by claim.lua, then wake
-- the queues of every instance (with an empty channel, no message: the
-- batcher has the last release of a batch publish for all of them).
-- KEYS: upstream hash, provider hash; ARGV: instance, wake channel or ''
for i = 1, 2 do
  local n = redis.call('HINCRBY', KEYS[i], ARGV[1], -1)
  if n <= 0 then redis.call('HDEL', KEYS[i], ARGV[1]) end
end
if ARGV[2] ~= '' then redis.call('PUBLISH', ARGV[2], 'release') end
return 1
