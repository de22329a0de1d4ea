-- ARGV: prefix. Milliseconds until the queue's first pending job is due: 0 when one is
-- due now (in a stream, or delayed and already due), -1 when none is pending.
local pending = redis.call('ZCARD', P .. 'st:pending')
if pending == 0 then return -1 end
local now = now_ms()
if pending > redis.call('ZCOUNT', P .. 'delayed', '(' .. now, '+inf') then return 0 end
local first = redis.call('ZRANGE', P .. 'delayed', 0, 0, 'WITHSCORES')
return math.max(0, math.floor(tonumber(first[2]) - now))
