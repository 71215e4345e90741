-- Reserve amount a of a client key if used + reserved + a stays within
-- every limit, else change nothing and name the first limit crossed (the
-- order and the rule of keys.Memory.Reserve). The day and month hashes
-- expire by themselves after their period.
-- KEYS: the key's day hash, its month hash
-- ARGV: tokens_per_day, spend_per_day, spend_per_month (0 = none),
--       tokens of a, spend of a, day ttl (s), month ttl (s)
-- Fields: ut/rt used/reserved tokens, us/rs used/reserved spend.
-- Returns 0 reserved, 1 tokens_per_day, 2 spend_per_day, 3 spend_per_month.
local function over(limit, have, more)
  return limit > 0 and (have + more > limit or have >= limit)
end
local function num(v) return tonumber(v or '0') end
local tpd, spd, spm = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local at, as = tonumber(ARGV[4]), tonumber(ARGV[5])
local d = redis.call('HMGET', KEYS[1], 'ut', 'rt', 'us', 'rs')
local m = redis.call('HMGET', KEYS[2], 'us', 'rs')
if over(tpd, num(d[1]) + num(d[2]), at) then return 1 end
if over(spd, num(d[3]) + num(d[4]), as) then return 2 end
if over(spm, num(m[1]) + num(m[2]), as) then return 3 end
redis.call('HINCRBY', KEYS[1], 'rt', ARGV[4])
redis.call('HINCRBY', KEYS[1], 'rs', ARGV[5])
redis.call('HINCRBY', KEYS[2], 'rs', ARGV[5])
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('EXPIRE', KEYS[2], ARGV[7])
return 0
