-- ARGV: prefix, finished_ttl_ms (0: succeeded jobs are kept). One atomic read of a
-- queue: {pending, processing, succeeded, dead, ready, oldest ready run_at ms or -1}.
-- Succeeded jobs count by score range: one whose hash expired but whose entry is not
-- yet swept is not counted. Cost: a few commands per priority, whatever the history.
local ttl = tonumber(ARGV[2])
local now = now_ms()
local function card(st) return redis.call('ZCARD', P .. 'st:' .. st) end
local pending = card('pending')
local succeeded
if ttl > 0 then
  succeeded = redis.call('ZCOUNT', P .. 'st:succeeded', now - ttl, '+inf')
else
  succeeded = card('succeeded')
end
-- Delayed jobs already due are ready: the next claim moves them to their stream.
local ready = pending - redis.call('ZCOUNT', P .. 'delayed', '(' .. now, '+inf')
local oldest = -1
local due = redis.call('ZRANGEBYSCORE', P .. 'delayed', '-inf', now, 'WITHSCORES', 'LIMIT', 0, 1)
if #due > 0 then oldest = tonumber(due[2]) end
-- The first entry past the group's last delivered one is the oldest undelivered
-- job of that stream; its id is the time it was pushed, which is its run_at.
for _, prio in ipairs(redis.call('ZRANGE', P .. 'prios', 0, -1)) do
  local stream = P .. 's:' .. prio
  local last = '0-0'
  local groups = redis.pcall('XINFO', 'GROUPS', stream)
  if type(groups) == 'table' and not groups.err then
    for _, g in ipairs(groups) do
      for i = 1, #g, 2 do
        if g[i] == 'last-delivered-id' then last = g[i + 1] end
      end
    end
  end
  local first = redis.call('XRANGE', stream, '(' .. last, '+', 'COUNT', 1)
  if #first > 0 then
    local ms = tonumber(string.match(first[1][1], '^(%d+)'))
    if oldest < 0 or ms < oldest then oldest = ms end
  end
end
return {pending, card('processing'), succeeded, card('dead'), ready, oldest, now}
