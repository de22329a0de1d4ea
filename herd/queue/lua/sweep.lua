-- ARGV: prefix, keep_ms, limit. Removes up to `limit` succeeded jobs finished more
-- than keep_ms ago: their hash (if it has not expired by itself) and their entry in
-- st:succeeded; their stream entry, lease and dedup key went when they finished.
-- The ids removed are also appended to `unindexed`, which the client drains into
-- HDEL herd:jobq (a key outside this queue's slot), so a crash between the two
-- leaves nothing behind. Returns {ids removed, entries examined}.
local keep_ms, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
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
return {out, #seen}
