-- Read a client key's accounting in the current day and month.
-- KEYS: the day hash, the month hash
-- Returns {used tokens, used spend today, used spend this month,
--          reserved tokens, reserved spend today}.
local function num(v) return tonumber(v or '0') end
local d = redis.call('HMGET', KEYS[1], 'ut', 'rt', 'us', 'rs')
local m = redis.call('HMGET', KEYS[2], 'us')
return {num(d[1]), num(d[3]), num(m[1]), num(d[2]), num(d[4])}
