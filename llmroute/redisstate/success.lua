-- A success on a shared backoff scope: the streak ends, and the cooling
-- with it unless a Retry-After hold is still running. Tells the others.
-- KEYS: the scope's hash; ARGV: channel, scope name
-- Returns the hold left (ms), 0 for none.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local hard = tonumber(redis.call('HGET', KEYS[1], 'hard') or '0')
local left = math.max(hard - now, 0)
local untilv = 0
if left > 0 then untilv = hard end
redis.call('HSET', KEYS[1], 'streak', 0, 'until', untilv)
redis.call('PUBLISH', ARGV[1], 'ok ' .. left .. ' ' .. ARGV[2])
return left
