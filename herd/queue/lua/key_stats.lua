-- ARGV: prefix, limit. The keys of a queue worth showing: every key with a job
-- processing (as many as the jobs processing at most) and the `limit` keys with most
-- jobs waiting. {key, running, waiting, its limit} each. Cost: O(keys running +
-- limit), however many keys have work.
local limit = tonumber(ARGV[2])
local wz = P .. 'kwaitz'
-- kwaitz follows kwait in every script that changes it (kinc); a queue whose jobs
-- were enqueued by a herd without kwaitz gets it here, once.
if redis.call('ZCARD', wz) ~= redis.call('HLEN', P .. 'kwait') then
  redis.call('DEL', wz)
  local w = redis.call('HGETALL', P .. 'kwait')
  for i = 1, #w, 2 do redis.call('ZADD', wz, w[i + 1], w[i]) end
end
local keys, seen = {}, {}
local function take(k)
  if not seen[k] then
    seen[k] = true
    keys[#keys + 1] = k
  end
end
for _, k in ipairs(redis.call('HKEYS', P .. 'krun')) do take(k) end
for _, k in ipairs(redis.call('ZREVRANGE', wz, 0, limit - 1)) do take(k) end
local out = {}
for _, k in ipairs(keys) do
  out[#out + 1] = {
    k,
    redis.call('HGET', P .. 'krun', k) or '0',
    redis.call('HGET', P .. 'kwait', k) or '0',
    redis.call('HGET', P .. 'kmax', k) or '1',
  }
end
return out
