-- A pool's affinity pin: the member that served an affinity key last.
-- KEYS[1] the pin; ARGV[1] the member ("" reads it, "-" forgets it);
-- ARGV[2] its TTL in milliseconds. Returns the member, "" for none.
if ARGV[1] == "" then
  return redis.call('GET', KEYS[1]) or ""
end
if ARGV[1] == "-" then
  redis.call('DEL', KEYS[1])
  return ""
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
