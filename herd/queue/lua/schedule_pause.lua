-- ARGV: prefix, name, paused 1/0, floor (µs since the epoch, '' for none)
-- A resume moves the last tick up to the floor: the ticks of the pause are dropped.
local key = P .. 'sched:' .. ARGV[2]
if redis.call('EXISTS', key) == 0 then return 0 end
redis.call('HSET', key, 'paused', ARGV[3])
if ARGV[4] ~= '' then
  local last = redis.call('HGET', key, 'last_tick')
  if not last or last == '' or tonumber(last) < tonumber(ARGV[4]) then
    redis.call('HSET', key, 'last_tick', ARGV[4])
  end
end
return 1
