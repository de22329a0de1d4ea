-- ARGV: prefix, owner, limit, live (the CLIENT ID of the owner's liveness connection,
-- '' for none), then dead owner / CLIENT ID pairs (marks found gone by the caller's
-- CLIENT LIST). Returns per leased job: {id, token, expires_ms, task, payload,
-- attempts, stalls, max_attempts, lease_seconds, trace, concurrency key}.
-- Order: jobs of dead owners and jobs whose lease expired (a stall: their worker
-- died or froze), then keyed jobs a turn per key (the keys with a ready job and room,
-- in kready's order; a key served goes to the back), then ready jobs by priority
-- (highest stream first), FIFO within a priority.
local owner, limit, live = ARGV[2], tonumber(ARGV[3]), ARGV[4]
local now = now_ms()
local out = {}

local function lease(id, old)
  local job = jkey(id)
  if old == 'processing' then disown(id) end
  -- A token is never below the server's clock in microseconds: a replica promoted
  -- after a failover that lost the last claims (replication is asynchronous) still
  -- hands out tokens past every one the old master gave, as long as the two clocks
  -- differ by less than the failover took (seconds: cluster-node-timeout).
  local t = redis.call('TIME')
  local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local last = tonumber(redis.call('HGET', job, 'token')) or 0
  local token = string.format('%d', math.max(last + 1, floor))
  redis.call('HSET', job, 'token', token)
  local ttl = math.floor(tonumber(redis.call('HGET', job, 'lease_seconds')) * 1000)
  redis.call('SET', lkey(id), token, 'PX', ttl)
  redis.call('ZADD', P .. 'leases', now + ttl, id)
  set_status(id, old, 'processing')
  redis.call('HSET', job, 'owner', owner, 'last_worker', owner, 'lease_expires_at', now + ttl)
  redis.call('HSETNX', job, 'started_at', now)
  own(id, owner, live)
  local d = redis.call('HMGET', job, 'task', 'payload', 'attempts', 'stalls', 'max_attempts',
    'lease_seconds', 'trace', 'ckey')
  out[#out + 1] = {id, token, now + ttl, d[1], d[2], d[3], d[4], d[5], d[6], d[7] or '',
    d[8] or ''}
end

-- Delayed jobs (backoff, `delay=`) that are due join their stream.
for _, id in ipairs(redis.call('ZRANGEBYSCORE', P .. 'delayed', '-inf', now, 'LIMIT', 0, 1000)) do
  redis.call('ZREM', P .. 'delayed', id)
  push(id)
end

-- Jobs of owners whose liveness connection is gone (their process was killed), while
-- their lease still runs. Only under the CLIENT ID the caller found dead: an owner
-- that has reconnected since (a new id) keeps its jobs. Their lease key goes first,
-- so that the expired-lease walk below leaves them alone.
local function take_over(id, stream_owner, why)
  local job = jkey(id)
  local stalls = redis.call('HINCRBY', job, 'stalls', 1)
  redis.call('HSET', job, 'last_error', why)
  redis.call('ZREM', P .. 'leases', id)
  if stalls > tonumber(redis.call('HGET', job, 'max_stalls')) then
    dead(id, 'processing', 'max_stalls', now)
  else
    local entry, prio = unpack(redis.call('HMGET', job, 'entry', 'priority'))
    if entry and entry ~= '' then
      redis.call('XCLAIM', P .. 's:' .. prio, GROUP, stream_owner, 0, entry, 'JUSTID')
    end
    lease(id, 'processing')
  end
end

for i = 5, #ARGV - 1, 2 do
  local gone, gone_id = ARGV[i], ARGV[i + 1]
  if #out >= limit then break end
  if redis.call('HGET', P .. 'owners', gone) == gone_id then
    local owned = P .. 'owned:' .. gone
    for _, id in ipairs(redis.call('SRANDMEMBER', owned, limit - #out)) do
      local job = jkey(id)
      local status, held_by = unpack(redis.call('HMGET', job, 'status', 'owner'))
      if status == 'processing' and held_by == gone and redis.call('EXISTS', lkey(id)) == 1 then
        redis.call('DEL', lkey(id))
        take_over(id, owner, 'worker ' .. gone .. ' died holding the lease')
      else  -- a stale entry (the lease expired and went elsewhere): drop it
        redis.call('SREM', owned, id)
      end
    end
    if redis.call('SCARD', owned) == 0 then redis.call('HDEL', P .. 'owners', gone) end
  end
end

-- Expired leases: the index says the time is up; the lease key must be gone too.
for _, id in ipairs(redis.call('ZRANGEBYSCORE', P .. 'leases', '-inf', now, 'LIMIT', 0, limit)) do
  if #out >= limit then break end
  if redis.call('EXISTS', lkey(id)) == 0 then
    local last = redis.call('HGET', jkey(id), 'owner')
    take_over(id, owner, 'lease expired while held by ' .. (last or '?'))
  end
end

-- Keyed jobs: one per turn. A key without a ready job or room leaves kready (it gets a
-- turn again when a job of it is pushed or gives its slot back).
while #out < limit do
  local head = redis.call('ZRANGE', P .. 'kready', 0, 0)
  if #head == 0 then break end
  local key = head[1]
  redis.call('ZREM', P .. 'kready', key)
  if kroom(key) > 0 then
    local first = redis.call('ZRANGE', P .. 'k:' .. key, 0, 0)
    if #first > 0 then
      redis.call('ZREM', P .. 'k:' .. key, first[1])
      local id = kid(first[1])
      if redis.call('HGET', jkey(id), 'status') == 'pending' then lease(id, 'pending') end
      kturn(key)
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
