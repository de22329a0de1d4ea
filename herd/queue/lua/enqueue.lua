-- ARGV: prefix, queue, count, queue number, first counter value, then per job: task
--       payload priority dedup_key delay_ms lease_seconds max_attempts max_stalls
--       trace_context ('' for none)
-- Returns per job: {id, created 0/1}. A job's id is the queue's own counter (ids, in
-- this queue's slot: no key of another slot is needed) times 2^20 plus the queue's
-- number, which says where get_job finds it. The counter starts past the ids an
-- older herd drew from its global herd:ids, so an id is never given twice.
local queue, n, qnum = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if redis.call('EXISTS', P .. 'ids') == 0 then redis.call('SET', P .. 'ids', ARGV[5]) end
local now = now_ms()
local out = {}
for j = 0, n - 1 do
  local b = 6 + j * 9
  local task, payload, prio, dedup = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local delay = tonumber(ARGV[b + 4])
  local holder = false
  local id = false
  if dedup ~= '' then
    holder = redis.call('GET', P .. 'dedup:' .. dedup)
  end
  if not holder then
    id = string.format('%d', redis.call('INCR', P .. 'ids') * 1048576 + qnum)
    if dedup ~= '' then redis.call('SET', P .. 'dedup:' .. dedup, id) end
  end
  if holder then
    out[#out + 1] = {holder, 0}
  else
    redis.call('HSET', jkey(id), 'id', id, 'task', task, 'queue', queue, 'payload', payload,
      'status', 'pending', 'priority', prio, 'dedup_key', dedup, 'attempts', 0, 'stalls', 0,
      'lease_seconds', ARGV[b + 5], 'max_attempts', ARGV[b + 6], 'max_stalls', ARGV[b + 7],
      'token', 0, 'run_at', now + delay, 'created_at', now, 'entry', '')
    if ARGV[b + 8] ~= '' then redis.call('HSET', jkey(id), 'trace', ARGV[b + 8]) end
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
