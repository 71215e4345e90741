-- Read backoff scopes, for an instance that may have missed their messages
-- (it subscribed late, or reconnected).
-- KEYS: the scopes' hashes. Returns {cooling left ms, streak, hold left ms}
-- per scope, flattened.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for _, k in ipairs(KEYS) do
  local v = redis.call('HMGET', k, 'streak', 'until', 'hard')
  local streak, untilv, hard = tonumber(v[1] or '0'), tonumber(v[2] or '0'), tonumber(v[3] or '0')
  out[#out + 1] = math.max(untilv - now, 0)
  out[#out + 1] = streak
  out[#out + 1] = math.max(hard - now, 0)
end
return out
