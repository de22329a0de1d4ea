-- ARGV: prefix, delay_ms, then id token pairs. Returns the ids given back (no attempt
-- counted), due delay_ms from now.
local now = now_ms()
local delay = tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV - 1, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  if held(id, token) then
    requeue(id, 'processing', delay, now)
    out[#out + 1] = id
  end
end
return out
