-- ARGV: prefix, finished_ttl_seconds (0: keep), then id token result triples.
-- Returns 1/0 per job: stored, or refused (stale token or expired lease).
local keep = tonumber(ARGV[2])
local now = now_ms()
local out = {}
for i = 3, #ARGV - 2, 3 do
  local id, token, result = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local job = jkey(id)
  if held(id, token) and redis.call('HGET', job, 'status') == 'processing' then
    finish(id, 'processing', 'succeeded', now)
    redis.call('HSET', job, 'result', result)
    if keep > 0 then redis.call('EXPIRE', job, keep) end
    out[#out + 1] = 1
  elseif redis.call('HGET', job, 'status') == 'succeeded'
      and redis.call('HGET', job, 'token') == token then
    out[#out + 1] = 1  -- a retry of a completion whose reply was lost
  else
    out[#out + 1] = 0
  end
end
return out
