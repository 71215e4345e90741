-- Name a request's session fleet-wide and record its history.
-- The longest known prefix names the session, else the candidate (the hash
-- of the whole history) does; then every prefix of the request is recorded
-- under that id with the TTL, so a growing, edited or regenerated
-- conversation keeps its id on every instance and stays known for the TTL
-- after its last turn.
-- A value is "<written at, s> <id>". A prefix already recorded under the id
-- less than ttl/64 ago (about 6 minutes of 6 h) is not written again: a
-- conversation's next turn then writes its new prefixes only, not all 128.
-- A value without the time (written by someone else) counts as stale.
-- KEYS: the request's prefix keys, longest first (at most 128)
-- ARGV: candidate id, ttl (s)
-- Returns the id.
local now = tonumber(redis.call('TIME')[1])
local ttl = tonumber(ARGV[2])
local vals = redis.call('MGET', unpack(KEYS))
local ids, ats = {}, {}
for i = 1, #KEYS do
  local v = vals[i]
  if v then
    local sp = string.find(v, ' ', 1, true)
    local at = sp and tonumber(string.sub(v, 1, sp - 1))
    if at then
      ats[i], ids[i] = at, string.sub(v, sp + 1)
    else
      ids[i] = v
    end
  end
end
local id = ARGV[1]
for i = 1, #KEYS do
  if ids[i] then
    id = ids[i]
    break
  end
end
local value = now .. ' ' .. id
for i = 1, #KEYS do
  if ids[i] ~= id or not ats[i] or (now - ats[i]) * 64 >= ttl then
    redis.call('SET', KEYS[i], value, 'EX', ttl)
  end
end
return id
