-- ARGV: prefix, name, task, queue, cron, every, timezone, policy, catch_up, priority,
--       last_tick (µs since the epoch, '' for none)
-- A new schedule starts at the tick given; a known one keeps its state (paused, last
-- tick, last run) and takes the definition.
local key = P .. 'sched:' .. ARGV[2]
local fresh = redis.call('EXISTS', key) == 0
redis.call('HSET', key, 'name', ARGV[2], 'task', ARGV[3], 'queue', ARGV[4], 'cron', ARGV[5],
  'every', ARGV[6], 'timezone', ARGV[7], 'policy', ARGV[8], 'catch_up', ARGV[9],
  'priority', ARGV[10])
if fresh then
  redis.call('HSET', key, 'paused', '0', 'last_tick', ARGV[11], 'last_job_id', '',
    'last_run_at', '', 'runs', 0)
end
return fresh and 1 or 0
