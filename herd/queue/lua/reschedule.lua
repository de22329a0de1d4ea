-- ARGV: prefix, delay_ms, then job ids. Pending jobs only (running and finished ones
-- are untouched) become due delay_ms from now. Returns the ids moved.
local now = now_ms()
local delay = tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  if redis.call('HGET', jkey(id), 'status') == 'pending' then
    -- Its stream entry (if ready) goes, or a claim would take it before it is due.
    ack(id)
    redis.call('ZREM', P .. 'delayed', id)
    redis.call('HSET', jkey(id), 'run_at', now + delay)
    if delay > 0 then
      redis.call('ZADD', P .. 'delayed', now + delay, id)
    else
      push(id)
    end
    out[#out + 1] = id
  end
end
return out
