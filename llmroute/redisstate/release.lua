-- Release count slots and units of capacity claimed by claim.lua (the
-- batcher merges the releases queued together for one pair into one call),
-- then wake the queues of every instance (with an empty channel, no
-- message: the batcher has the last release of a batch publish for all).
-- KEYS: upstream hash, provider hash; ARGV: instance, count, wake channel or ''
for i = 1, 2 do
  local n = redis.call('HINCRBY', KEYS[i], ARGV[1], -tonumber(ARGV[2]))
  if n <= 0 then redis.call('HDEL', KEYS[i], ARGV[1]) end
end
if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[3], 'release') end
return 1
