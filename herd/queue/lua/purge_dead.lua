-- ARGV: prefix, keep_ms, limit. Deletes up to `limit` dead-lettered jobs finished
-- more than keep_ms ago (hash and st:dead entry) and trims the dlq record stream to
-- the same age (its entry ids are milliseconds). Ids removed go to `unindexed` as in
-- sweep.lua. Returns {ids removed, entries examined}.
local keep_ms, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local cutoff = now_ms() - keep_ms
local st = P .. 'st:dead'
local out = {}
local seen = redis.call('ZRANGEBYSCORE', st, '-inf', '(' .. cutoff, 'LIMIT', 0, limit)
for _, id in ipairs(seen) do
  local status, finished = unpack(redis.call('HMGET', jkey(id), 'status', 'finished_at'))
  if status == 'dead' and finished and finished ~= '' and tonumber(finished) >= cutoff then
    redis.call('ZADD', st, finished, id)  -- scored by id by an older herd
  else
    if status == 'dead' then redis.call('DEL', jkey(id)) end
    redis.call('ZREM', st, id)
    out[#out + 1] = id
  end
end
if #out > 0 then redis.call('RPUSH', P .. 'unindexed', unpack(out)) end
if redis.call('EXISTS', P .. 'dlq') == 1 then
  redis.call('XTRIM', P .. 'dlq', 'MINID', cutoff)
end
return {out, #seen}
