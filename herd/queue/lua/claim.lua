-- ARGV: prefix, owner, limit. Returns per leased job: {id, token, expires_ms, task, payload,
-- attempts, stalls, max_attempts, lease_seconds}.
-- Order: jobs whose lease expired (a stall: their worker died or froze), then
-- ready jobs by priority (highest stream first), FIFO within a priority.
local owner, limit = ARGV[2], tonumber(ARGV[3])
local now = now_ms()
local out = {}

local function lease(id, old)
  local job = jkey(id)
  local token = redis.call('HINCRBY', job, 'token', 1)
  local ttl = math.floor(tonumber(redis.call('HGET', job, 'lease_seconds')) * 1000)
  redis.call('SET', lkey(id), token, 'PX', ttl)
  redis.call('ZADD', P .. 'leases', now + ttl, id)
  set_status(id, old, 'processing')
  redis.call('HSET', job, 'owner', owner, 'last_worker', owner, 'lease_expires_at', now + ttl)
  redis.call('HSETNX', job, 'started_at', now)
  local d = redis.call('HMGET', job, 'task', 'payload', 'attempts', 'stalls', 'max_attempts',
    'lease_seconds')
  out[#out + 1] = {id, token, now + ttl, d[1], d[2], d[3], d[4], d[5], d[6]}
end

-- Delayed jobs (backoff, `delay=`) that are due join their stream.
for _, id in ipairs(redis.call('ZRANGEBYSCORE', P .. 'delayed', '-inf', now, 'LIMIT', 0, 1000)) do
  redis.call('ZREM', P .. 'delayed', id)
  push(id)
end

-- Expired leases: the index says the time is up; the lease key must be gone too.
for _, id in ipairs(redis.call('ZRANGEBYSCORE', P .. 'leases', '-inf', now, 'LIMIT', 0, limit)) do
  if redis.call('EXISTS', lkey(id)) == 0 then
    local job = jkey(id)
    local stalls = redis.call('HINCRBY', job, 'stalls', 1)
    local last = redis.call('HGET', job, 'owner')
    redis.call('HSET', job, 'last_error', 'lease expired while held by ' .. (last or '?'))
    redis.call('ZREM', P .. 'leases', id)
    if stalls > tonumber(redis.call('HGET', job, 'max_stalls')) then
      dead(id, 'processing', 'max_stalls', now)
    else
      local entry, prio = unpack(redis.call('HMGET', job, 'entry', 'priority'))
      if entry and entry ~= '' then
        redis.call('XCLAIM', P .. 's:' .. prio, GROUP, owner, 0, entry, 'JUSTID')
      end
      lease(id, 'processing')
    end
  end
end

local prios = redis.call('ZREVRANGE', P .. 'prios', 0, -1)
for _, prio in ipairs(prios) do
  local stream = P .. 's:' .. prio
  while #out < limit do
    local got = redis.call('XREADGROUP', 'GROUP', GROUP, owner, 'COUNT', limit - #out,
      'STREAMS', stream, '>')
    if not got then break end
    local entries = got[1][2]
    if #entries == 0 then break end
    for _, e in ipairs(entries) do
      local id = e[2][2]
      if redis.call('HGET', jkey(id), 'status') == 'pending' then
        lease(id, 'pending')
      else  -- a stale entry (job requeued or removed meanwhile): drop it
        redis.call('XACK', stream, GROUP, e[1])
        redis.call('XDEL', stream, e[1])
      end
    end
  end
  if #out >= limit then break end
end
return out
