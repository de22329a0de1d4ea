-- ARGV: prefix, then job ids ('*' alone: every dead job). Returns the ids requeued.
-- Refuses the whole call if a job's dedup key is held by an active job.
local ids = {}
if ARGV[2] == '*' then
  ids = redis.call('ZRANGE', P .. 'st:dead', 0, -1)
else
  for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
end
local todo = {}
for _, id in ipairs(ids) do
  if redis.call('HGET', jkey(id), 'status') == 'dead' then
    local key = redis.call('HGET', jkey(id), 'dedup_key')
    if key and key ~= '' and redis.call('EXISTS', P .. 'dedup:' .. key) == 1 then
      return redis.error_reply('DEDUP an active job already holds dedup key ' .. key)
    end
    todo[#todo + 1] = id
  end
end
local now = now_ms()
for _, id in ipairs(todo) do
  local key = redis.call('HGET', jkey(id), 'dedup_key')
  if key and key ~= '' then redis.call('SET', P .. 'dedup:' .. key, id) end
  redis.call('HSET', jkey(id), 'attempts', 0, 'stalls', 0, 'dead_reason', '', 'finished_at', '')
  requeue(id, 'dead', 0, now)
end
return todo
