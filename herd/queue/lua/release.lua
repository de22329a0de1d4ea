-- ARGV: prefix, then id token pairs. Returns the ids given back (no attempt counted).
local now = now_ms()
local out = {}
for i = 2, #ARGV - 1, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  if held(id, token) then
    requeue(id, 'processing', 0, now)
    out[#out + 1] = id
  end
end
return out
