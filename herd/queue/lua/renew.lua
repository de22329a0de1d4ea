-- ARGV: prefix, owner, live (its liveness connection's CLIENT ID, '' for none), then
-- id token pairs of the owner's leases. Returns {id, expires_ms} for each lease still held.
-- A renewed job records the owner's current CLIENT ID: after its liveness connection
-- was remade (a new id), the next heartbeat makes the mark stand for its jobs again.
local owner, live = ARGV[2], ARGV[3]
local now = now_ms()
local out = {}
for i = 4, #ARGV - 1, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  if held(id, token) then
    local ttl = math.floor(tonumber(redis.call('HGET', jkey(id), 'lease_seconds')) * 1000)
    redis.call('PEXPIRE', lkey(id), ttl)
    redis.call('ZADD', P .. 'leases', now + ttl, id)
    redis.call('HSET', jkey(id), 'lease_expires_at', now + ttl)
    if live ~= '' then
      local by, was = unpack(redis.call('HMGET', jkey(id), 'owner', 'live'))
      if by == owner and was ~= live then own(id, owner, live) end
    end
    out[#out + 1] = {id, now + ttl}
  end
end
return out
