-- ARGV: prefix, then id token pairs. Returns {id, expires_ms} for each lease still held.
local now = now_ms()
local out = {}
for i = 2, #ARGV - 1, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  if held(id, token) then
    local ttl = math.floor(tonumber(redis.call('HGET', jkey(id), 'lease_seconds')) * 1000)
    redis.call('PEXPIRE', lkey(id), ttl)
    redis.call('ZADD', P .. 'leases', now + ttl, id)
    redis.call('HSET', jkey(id), 'lease_expires_at', now + ttl)
    out[#out + 1] = {id, now + ttl}
  end
end
return out
