-- ARGV: prefix, then job ids ('*' alone: every dead job).
-- Returns {requeued ids, {id, dedup key, holder id} of each job skipped}: a job whose
-- dedup key an active job holds stays dead, and the others go back all the same.
local ids = {}
if ARGV[2] == '*' then
  ids = redis.call('ZRANGE', P .. 'st:dead', 0, -1)
  -- st:dead is scored by finish time; of dead jobs sharing a free key the lowest id
  -- wins, as on PostgreSQL.
  table.sort(ids, function(a, b) return tonumber(a) < tonumber(b) end)
else
  for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
end
local now = now_ms()
local done, skipped = {}, {}
for _, id in ipairs(ids) do
  if redis.call('HGET', jkey(id), 'status') == 'dead' then
    local key = redis.call('HGET', jkey(id), 'dedup_key')
    local holder = key and key ~= '' and redis.call('GET', P .. 'dedup:' .. key)
    if holder then
      skipped[#skipped + 1] = {id, key, holder}
    else
      if key and key ~= '' then redis.call('SET', P .. 'dedup:' .. key, id) end
      redis.call('HSET', jkey(id), 'attempts', 0, 'stalls', 0, 'dead_reason', '', 'finished_at', '')
      requeue(id, 'dead', 0, now)
      done[#done + 1] = id
    end
  end
end
return {done, skipped}
