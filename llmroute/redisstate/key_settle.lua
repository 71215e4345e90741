-- Settle a reservation of a client key: the hold leaves the reservations
-- of its day and month when they are still the current ones (an older
-- period's hash has expired or will) and its lease is still there (an
-- expired lease has left them already, and Redis may have restarted and
-- lost it), and the actual amount is added to the current period's use.
-- Once per reservation: its bit in its Store's settled bitmap is set with
-- the settlement, and a settlement sent again (its reply was lost, so the
-- caller could not know it was applied) finds it set and changes nothing.
-- KEYS: the current day hash, the current month hash, the key's holds set,
--       the settled bitmap of the reservation's Store and number block
-- ARGV: hold in this day (1/0), hold in this month (1/0), minus the
--       reserved tokens, minus the reserved spend, actual tokens, actual
--       spend, day ttl, month ttl (s), the lease's member, its bit in the
--       bitmap ('' = none). The negation is the caller's: Lua would write a
--       large number in exponent form, which HINCRBY refuses.
-- Returns 0 settled, 1 settled before (nothing done).
if ARGV[10] ~= '' then
  if redis.call('SETBIT', KEYS[4], ARGV[10], 1) == 1 then return 1 end
  redis.call('EXPIRE', KEYS[4], ARGV[7])
end
if redis.call('ZREM', KEYS[3], ARGV[9]) == 1 then
  if ARGV[1] == '1' then
    redis.call('HINCRBY', KEYS[1], 'rt', ARGV[3])
    redis.call('HINCRBY', KEYS[1], 'rs', ARGV[4])
  end
  if ARGV[2] == '1' then
    redis.call('HINCRBY', KEYS[2], 'rs', ARGV[4])
  end
end
redis.call('HINCRBY', KEYS[1], 'ut', ARGV[5])
redis.call('HINCRBY', KEYS[1], 'us', ARGV[6])
redis.call('HINCRBY', KEYS[2], 'us', ARGV[6])
redis.call('EXPIRE', KEYS[1], ARGV[7])
redis.call('EXPIRE', KEYS[2], ARGV[8])
return 0
