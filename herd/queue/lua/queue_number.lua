-- KEYS: herd:{queues}:num (hash queue -> number), herd:{queues}:name (number -> queue),
-- herd:{queues}:next (the last number given), herd:{queues}:free (numbers of reclaimed
-- queues, scored by when they were freed). ARGV: queue, the most queues (HERD_MAX_QUEUES),
-- µs a freed number waits before it is given again (longer than any process caches a
-- number's queue). Returns {number, server time µs}: the low bits of each of the
-- queue's job ids (herd.queue.redis), 0 when a new queue would pass the bound; the time
-- tells enqueue.lua whether the number was read before the queue was reclaimed.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])  -- µs: orders this slot's steps
local num = redis.call('HGET', KEYS[1], ARGV[1])
if num then return {tonumber(num), now} end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[2]) then return {0, now} end
local free = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now - tonumber(ARGV[3]), 'LIMIT', 0, 1)
if #free > 0 then
  num = tonumber(free[1])
  redis.call('ZREM', KEYS[4], free[1])
else
  num = redis.call('INCR', KEYS[3])
end
redis.call('HSET', KEYS[1], ARGV[1], num)
redis.call('HSET', KEYS[2], num, ARGV[1])
return {num, now}
