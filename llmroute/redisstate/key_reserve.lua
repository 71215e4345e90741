-- Reserve amount a of a client key if used + reserved + a stays within
-- every limit, else change nothing and name the first limit crossed (the
-- order and the rule of keys.Memory.Reserve). Expired reservations are
-- dropped first; the new one is a lease of lease ttl (key_lease.lua). The
-- day and month hashes and the holds set expire by themselves after their
-- period. With an empty member it only checks (KeyRoom): the limit
-- crossed, or 0 with nothing reserved.
-- KEYS: the key's day hash, its month hash, its holds set
-- ARGV: tokens_per_day, spend_per_day, spend_per_month (0 = none),
--       tokens of a, spend of a, day ttl (s), month ttl (s), current day,
--       current month, lease ttl (ms), the lease's member ('' = check only)
-- Fields: ut/rt used/reserved tokens, us/rs used/reserved spend.
-- Returns 0 reserved, 1 tokens_per_day, 2 spend_per_day, 3 spend_per_month.
local function over(limit, have, more)
  return limit > 0 and (have + more > limit or have >= limit)
end
local function num(v) return tonumber(v or '0') end
local now = now_ms()
drop_expired(KEYS[3], KEYS[1], KEYS[2], ARGV[8], ARGV[9], now)
local tpd, spd, spm = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local at, as = tonumber(ARGV[4]), tonumber(ARGV[5])
local d = redis.call('HMGET', KEYS[1], 'ut', 'rt', 'us', 'rs')
local m = redis.call('HMGET', KEYS[2], 'us', 'rs')
if over(tpd, num(d[1]) + num(d[2]), at) then return 1 end
if over(spd, num(d[3]) + num(d[4]), as) then return 2 end
if over(spm, num(m[1]) + num(m[2]), as) then return 3 end
if ARGV[11] == '' then return 0 end
redis.call('HINCRBY', KEYS[1], 'rt', ARGV[4])
redis.call('HINCRBY', KEYS[1], 'rs', ARGV[5])
redis.call('HINCRBY', KEYS[2], 'rs', ARGV[5])
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[10]), ARGV[11])
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('EXPIRE', KEYS[2], ARGV[7])
redis.call('EXPIRE', KEYS[3], ARGV[6])
return 0
