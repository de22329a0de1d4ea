-- ARGV: prefix, queue, count, queue number, first counter value, the highest counter
--       this client has seen, the server time (µs) at which the number was just read
--       from herd:{queues} (0: a number the caller cached), then per job: task payload
--       priority dedup_key delay_ms lease_seconds max_attempts max_stalls trace_context
--       ('' for none) concurrency_key ('' for none) max_running_per_key
-- Returns per job: {id, created 0/1}; or 'renumber' (nothing written) when the queue's
-- slot does not hold the number the caller cached. A job's id is the queue's own
-- counter (ids, in this queue's slot: no key of another slot is needed) times 2^20 plus
-- the queue's number, which says where get_job finds it. The counter starts past the
-- ids an older herd drew from its global herd:ids, so an id is never given twice.
local queue, n, qnum = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
-- The queue's number is kept in its slot too: after the server lost its data, a
-- process's cached number may have gone to another queue, whose ids would then name
-- this queue's jobs too. A cached number that the slot does not confirm is asked again;
-- so is one read before the queue was reclaimed (retire.lua): that number is free.
local renumbered = redis.call('GET', P .. 'num') ~= ARGV[4]
if renumbered then
  local read = tonumber(ARGV[7])
  if read == 0 or read <= tonumber(redis.call('GET', P .. 'retired') or -1) then
    return 'renumber'
  end
end
-- A counter lost with the server's data (no AOF, a snapshot restored, a failover that
-- lost the last writes) must not give its ids again: PostgreSQL rows (evaluation
-- items) still name them. So a counter is never below the server's clock, in quarter
-- seconds since 2026 (IDS_PER_SECOND): ids stay below 2^53 (exact in JavaScript)
-- until 2094. A queue that enqueued faster than that for a while is ahead of the
-- clock, and after a loss within that while only the caller's memory (the highest
-- counter it has seen, ARGV[6]) keeps it from giving an id again.
local IDS_PER_SECOND, EPOCH = 4, 1767225600
local t = redis.call('TIME')
local floor = math.max(
  (tonumber(t[1]) - EPOCH) * IDS_PER_SECOND
    + math.floor(tonumber(t[2]) * IDS_PER_SECOND / 1000000),
  tonumber(ARGV[6]) + 1)
-- Refused before any write: a counter past 2^33 gives ids past 2^53.
local counter = tonumber(redis.call('GET', P .. 'ids') or ARGV[5])
if math.max(counter, floor) + n >= 8589934592 then
  return redis.error_reply('herd: the job ids of queue ' .. queue .. ' are used up')
end
if renumbered then
  redis.call('SET', P .. 'num', ARGV[4])
  redis.call('DEL', P .. 'retired')
end
if redis.call('EXISTS', P .. 'ids') == 0 then redis.call('SET', P .. 'ids', ARGV[5]) end
local function next_counter()
  local c = redis.call('INCR', P .. 'ids')
  if c < floor then
    redis.call('SET', P .. 'ids', floor)
    c = floor
  end
  return c
end
local now = now_ms()
local out = {}
for j = 0, n - 1 do
  local b = 8 + j * 11
  local task, payload, prio, dedup = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local delay = tonumber(ARGV[b + 4])
  local holder = false
  local id = false
  if dedup ~= '' then
    holder = redis.call('GET', P .. 'dedup:' .. dedup)
  end
  if not holder then
    id = string.format('%d', next_counter() * 1048576 + qnum)
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
    local ckey = ARGV[b + 9]
    if ckey ~= '' then
      redis.call('HSET', jkey(id), 'ckey', ckey)
      redis.call('HSET', P .. 'kmax', ckey, ARGV[b + 10])
      kinc('kwait', ckey, 1)
    end
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
