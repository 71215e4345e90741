-- Fleet-wide use of each given hash, expired instances left out.
-- KEYS: pairs of (hash, leases); returns one count per pair.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #KEYS, 2 do
  local live = {}
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[i + 1], now, '+inf')) do live[m] = true end
  local n = 0
  local kv = redis.call('HGETALL', KEYS[i])
  for j = 1, #kv, 2 do
    if live[kv[j]] then n = n + tonumber(kv[j + 1]) end
  end
  out[#out + 1] = n
end
return out
