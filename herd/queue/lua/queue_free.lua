-- Reclaiming an empty queue's number, in herd:{queues}'s slot (KEYS as queue_number.lua),
-- around retire.lua in the queue's own slot. ARGV: queue, step, number, emptied.
-- 'begin': unmap the queue (a new enqueue asks for a number again, and gets another);
--   its old number still names it. Returns {number or 0, server time µs}.
-- 'end': retire.lua emptied the queue: free the number (given again after the wait of
--   queue_number.lua); it did not (a job came meanwhile): map the queue back, unless it
--   has taken a new number since, and then the old one still names it (never reused).
local queue, step = ARGV[1], ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])  -- µs: orders this slot's steps
if step == 'begin' then
  local num = redis.call('HGET', KEYS[1], queue)
  if not num then return {0, now} end
  redis.call('HDEL', KEYS[1], queue)
  return {tonumber(num), now}
end
local num = ARGV[3]
if ARGV[4] == '1' then
  if redis.call('HGET', KEYS[2], num) == queue then redis.call('HDEL', KEYS[2], num) end
  redis.call('ZADD', KEYS[4], now, num)
elseif not redis.call('HGET', KEYS[1], queue) then
  redis.call('HSET', KEYS[1], queue, num)
end
return {tonumber(num), now}
