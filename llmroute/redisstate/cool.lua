-- Record a failure (doubling the backoff: 1s, 2s, 4s, … up to the cap) or a
-- Retry-After hold on a backoff scope shared by every instance, and tell the
-- others. Durations go out relative to now, so clocks do not matter.
-- KEYS: the scope's hash (streak, until, hard: server ms)
-- ARGV: cap (ms), hold (ms; 0 = a failure), channel, scope name
-- Returns {cooling left ms, streak, hold left ms}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local streak = tonumber(redis.call('HGET', KEYS[1], 'streak') or '0')
local untilv = tonumber(redis.call('HGET', KEYS[1], 'until') or '0')
local hard = tonumber(redis.call('HGET', KEYS[1], 'hard') or '0')
local cap, hold = tonumber(ARGV[1]), tonumber(ARGV[2])
local d
if hold > 0 then
  d = hold
  if now + hold > hard then hard = now + hold end
else
  d = 1000
  for _ = 1, streak do
    if d >= cap then break end
    d = d * 2
  end
  if d > cap then d = cap end
  streak = streak + 1
end
if now + d > untilv then untilv = now + d end
redis.call('HSET', KEYS[1], 'streak', streak, 'until', untilv, 'hard', hard)
redis.call('PEXPIRE', KEYS[1], 86400000)
local left, hardLeft = untilv - now, math.max(hard - now, 0)
redis.call('PUBLISH', ARGV[3], 'cool ' .. left .. ' ' .. streak .. ' ' .. hardLeft .. ' ' .. ARGV[4])
return {left, streak, hardLeft}
