-- Appended to enqueue.lua, which this file runs as enqueue_jobs() (its ARGV first),
-- then three more ARGV: the schedule's name, the last tick the caller saw ('' for
-- none) and the tick it fires ('' for a run asked for by hand), µs since the epoch.
-- The tick's compare-and-set and the enqueue of its jobs are one script: each tick of
-- a schedule makes its jobs once, however many workers fire it.
local na = #ARGV
local name, after, tick = ARGV[na - 2], ARGV[na - 1], ARGV[na]
local key = P .. 'sched:' .. name
if redis.call('EXISTS', key) == 0 then return 'missing' end
if tick ~= '' then
  local paused, last = unpack(redis.call('HMGET', key, 'paused', 'last_tick'))
  if paused == '1' or (last or '') ~= after then return 'stale' end
end
local out = enqueue_jobs()
if type(out) ~= 'table' or out.err then return out end  -- 'renumber', or an error
if tick ~= '' then redis.call('HSET', key, 'last_tick', tick) end
redis.call('HSET', key, 'last_job_id', out[#out][1], 'last_run_at', now_ms())
redis.call('HINCRBY', key, 'runs', #out)
return out
