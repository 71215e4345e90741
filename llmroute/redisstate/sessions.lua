-- Name a request's session fleet-wide (SPEC §5) and record its history.
-- The longest known prefix names the session, else the candidate (the hash
-- of the whole history) does; then every prefix of the request is recorded
-- under that id with the TTL, so a growing, edited or regenerated
-- conversation keeps its id on every instance and stays known for the TTL
-- after its last turn.
-- KEYS: the request's prefix keys, longest first (at most 128)
-- ARGV: candidate id, ttl (s)
-- Returns the id.
local ids = redis.call('MGET', unpack(KEYS))
local id = ARGV[1]
for i = 1, #KEYS do
  if ids[i] then
    id = ids[i]
    break
  end
end
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], id, 'EX', ARGV[2])
end
return id
