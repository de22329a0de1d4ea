-- ARGV: prefix, first minute (epoch // 60), minutes. Returns the jobs of this queue that
-- succeeded in each of those minutes, then those dead-lettered: one script per queue
-- rather than one read per queue and minute (the dashboard polls this every 2 s).
local first, n = tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
for i = 0, n - 1 do
  local h = redis.call('HMGET', P .. 'tp:' .. (first + i), 'succeeded', 'dead')
  out[i + 1] = tonumber(h[1]) or 0
  out[n + i + 1] = tonumber(h[2]) or 0
end
return out
