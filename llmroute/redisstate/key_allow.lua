-- GCRA check of one request of a client key (see keys/gcra.go), on the
-- server's clock so that instances' clocks do not matter. The key holds the
-- theoretical arrival time (µs); it expires once it is in the past, when
-- an absent key means the same as a stale one.
-- KEYS: the key's rate key
-- ARGV: emission interval T (µs), burst (≥ 1)
-- Returns {1, 0} admitted or {0, µs until a request would be}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local allow_at = tat - (burst - 1) * interval
if now < allow_at then return {0, allow_at - now} end
tat = tat + interval
redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
return {1, 0}
