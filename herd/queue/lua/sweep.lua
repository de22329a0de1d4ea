-- ARGV: prefix, keep_ms, limit, consumer_idle_ms. Removes up to `limit` succeeded jobs finished more
-- than keep_ms ago: their hash (if it has not expired by itself) and their entry in
-- st:succeeded; their stream entry, lease and dedup key went when they finished.
-- The ids removed are also appended to `unindexed`, which the client drains into
-- HDEL herd:jobq (a key outside this queue's slot), so a crash between the two
-- leaves nothing behind. Returns {ids removed, entries examined}.
local keep_ms, limit, idle_ms = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local cutoff = now_ms() - keep_ms
local st = P .. 'st:succeeded'
local out = {}
local seen = redis.call('ZRANGEBYSCORE', st, '-inf', '(' .. cutoff, 'LIMIT', 0, limit)
for _, id in ipairs(seen) do
  local status, finished = unpack(redis.call('HMGET', jkey(id), 'status', 'finished_at'))
  if status == 'succeeded' and finished and tonumber(finished) >= cutoff then
    -- scored by id (written before herd scored finished jobs by finish time)
    redis.call('ZADD', st, finished, id)
  else
    if status == 'succeeded' then redis.call('DEL', jkey(id)) end
    redis.call('ZREM', st, id)
    out[#out + 1] = id
  end
end
if #out > 0 then redis.call('RPUSH', P .. 'unindexed', unpack(out)) end

-- Every worker process reads as a consumer of its own name, and a consumer group
-- keeps its consumers for good: drop those with nothing pending, idle for an hour
-- (idle_ms; a live worker that reads again is added back by XREADGROUP itself).
for _, prio in ipairs(redis.call('ZRANGE', P .. 'prios', 0, -1)) do
  local stream = P .. 's:' .. prio
  local consumers = redis.pcall('XINFO', 'CONSUMERS', stream, GROUP)
  if type(consumers) == 'table' and not consumers.err then
    for _, c in ipairs(consumers) do
      local f = {}
      for i = 1, #c, 2 do f[c[i]] = c[i + 1] end
      if tonumber(f['pending']) == 0 and tonumber(f['idle']) > idle_ms then
        redis.call('XGROUP', 'DELCONSUMER', stream, GROUP, f['name'])
      end
    end
  end
end
return {out, #seen}
