-- ARGV: prefix, queue, count, then per job: id task payload priority dedup_key delay_ms
--       lease_seconds max_attempts max_stalls
-- Returns per job: {id, created 0/1}.
local queue, n = ARGV[2], tonumber(ARGV[3])
local now = now_ms()
local out = {}
for j = 0, n - 1 do
  local b = 4 + j * 9
  local id, task, payload, prio, dedup = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4]
  local delay = tonumber(ARGV[b + 5])
  local holder = false
  if dedup ~= '' then
    holder = redis.call('GET', P .. 'dedup:' .. dedup)
    if not holder then redis.call('SET', P .. 'dedup:' .. dedup, id) end
  end
  if holder then
    out[#out + 1] = {holder, 0}
  else
    redis.call('HSET', jkey(id), 'id', id, 'task', task, 'queue', queue, 'payload', payload,
      'status', 'pending', 'priority', prio, 'dedup_key', dedup, 'attempts', 0, 'stalls', 0,
      'lease_seconds', ARGV[b + 6], 'max_attempts', ARGV[b + 7], 'max_stalls', ARGV[b + 8],
      'token', 0, 'run_at', now + delay, 'created_at', now, 'entry', '')
    redis.call('ZADD', P .. 'st:pending', id, id)
    if delay > 0 then
      redis.call('ZADD', P .. 'delayed', now + delay, id)
    else
      push(id)
    end
    out[#out + 1] = {id, 1}
  end
end
return out
