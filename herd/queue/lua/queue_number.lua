-- KEYS: herd:{queues}:num (hash queue -> number), herd:{queues}:name (number -> queue),
-- herd:{queues}:next (the last number given). ARGV: queue. Returns the queue's
-- number, given once for good: the low bits of each of its job ids (herd.queue.redis).
local num = redis.call('HGET', KEYS[1], ARGV[1])
if num then return tonumber(num) end
num = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[1], ARGV[1], num)
redis.call('HSET', KEYS[2], num, ARGV[1])
return num
