-- Read a client key's accounting in the current day and month, after
-- dropping its expired reservations (key_lease.lua).
-- KEYS: the day hash, the month hash, the holds set
-- ARGV: current day, current month
-- Returns {used tokens, used spend today, used spend this month,
--          reserved tokens, reserved spend today}.
local function num(v) return tonumber(v or '0') end
drop_expired(KEYS[3], KEYS[1], KEYS[2], ARGV[1], ARGV[2], now_ms())
local d = redis.call('HMGET', KEYS[1], 'ut', 'rt', 'us', 'rs')
local m = redis.call('HMGET', KEYS[2], 'us')
return {num(d[1]), num(d[3]), num(m[1]), num(d[2]), num(d[4])}
