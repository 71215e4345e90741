-- Prepended to the scripts that read or take a key's reservations. A
-- reservation is a lease: a member of the key's holds set, scored with its
-- expiry (server clock, ms) and renewed by its instance while the request
-- runs. One that expires (its instance died, or its settlement never
-- reached Redis) leaves the reservations of the day and month it was
-- taken in, when those are still the current ones (older periods no longer
-- count). Member: "<unique>:<day>:<month>:<tokens>:<spend>"; the amounts
-- stay strings, negated by a leading '-', because Lua would write a large
-- number in exponent form, which HINCRBY refuses (and "-0" as well).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function unreserve(dh, mh, day, month, member)
  local d, m, tok, sp = string.match(member, ':(%d+):(%d+):(%d+):(%d+)$')
  if not d then return end
  if d == day then
    if tok ~= '0' then redis.call('HINCRBY', dh, 'rt', '-' .. tok) end
    if sp ~= '0' then redis.call('HINCRBY', dh, 'rs', '-' .. sp) end
  end
  if m == month and sp ~= '0' then redis.call('HINCRBY', mh, 'rs', '-' .. sp) end
end
local function drop_expired(holds, dh, mh, day, month, now)
  local gone = redis.call('ZRANGEBYSCORE', holds, '-inf', now)
  for _, member in ipairs(gone) do unreserve(dh, mh, day, month, member) end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', holds, '-inf', now) end
end
