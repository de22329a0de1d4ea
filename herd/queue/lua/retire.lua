-- ARGV: prefix, the queue's number, server time µs at which queue_free.lua unmapped it,
-- minutes of throughput a queue keeps its number for. A queue with no job at all (any
-- status, delayed included), none finished within those minutes (the dashboard reads
-- their throughput through the queue's name), and still under that number loses it: its num key goes, and a 'retired' mark keeps enqueue.lua from taking the
-- number back from a caller that read it before the unmapping. Its empty streams and
-- record stream go too; its id counter stays (ids are never given twice). Returns 1 if
-- retired, 0 if not.
if redis.call('GET', P .. 'num') ~= ARGV[2] then return 0 end
for _, st in ipairs({'pending', 'processing', 'succeeded', 'dead'}) do
  if redis.call('ZCARD', P .. 'st:' .. st) > 0 then return 0 end
end
if redis.call('ZCARD', P .. 'delayed') > 0 then return 0 end
local minute = math.floor(now_ms() / 60000)
for m = minute - tonumber(ARGV[4]) + 1, minute do
  if redis.call('EXISTS', P .. 'tp:' .. m) == 1 then return 0 end
end
for _, prio in ipairs(redis.call('ZRANGE', P .. 'prios', 0, -1)) do
  redis.call('DEL', P .. 's:' .. prio)
end
redis.call('DEL', P .. 'prios', P .. 'dlq', P .. 'num', P .. 'kready', P .. 'kseq')
redis.call('SET', P .. 'retired', ARGV[3])
return 1
