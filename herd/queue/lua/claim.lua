-- ARGV: prefix, owner, limit, live (the CLIENT ID of the owner's liveness connection,
-- '' for none), then dead owner / CLIENT ID pairs (marks found gone by the caller's
-- CLIENT LIST). Returns per leased job: {id, token, expires_ms, task, payload,
-- attempts, stalls, max_attempts, lease_seconds, trace, concurrency key}.
-- Order: jobs of dead owners and jobs whose lease expired (a stall: their worker
-- died or froze), then ready jobs, keyed or not, by priority, then turn (keyed jobs a
-- turn per key, in kready's order), then age (the keyed and free loops below).
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

-- A ready job without a key off its stream (the next one the group has not yet handed
-- out), stale entries (a job requeued or removed meanwhile) dropped on the way.
local function take_free(stream)
  while true do
    local got = redis.call('XREADGROUP', 'GROUP', GROUP, owner, 'COUNT', 1, 'STREAMS', stream, '>')
    if not got or #got[1][2] == 0 then return end
    local e = got[1][2][1]
    local id = e[2][2]
    if redis.call('HGET', jkey(id), 'status') == 'pending' then
      lease(id, 'pending')
      return
    end
    redis.call('XACK', stream, GROUP, e[1])
    redis.call('XDEL', stream, e[1])
  end
end

-- The next n ready jobs without a key, in claim order (the highest priority's stream
-- first, FIFO within it), looked at, not taken: {prio, id, stream} each.
local function peek_free(n)
  local got = {}
  for _, prio in ipairs(redis.call('ZREVRANGE', P .. 'prios', 0, -1)) do
    local stream = P .. 's:' .. prio
    local from = '-'
    for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
      for i = 1, #g, 2 do
        if g[i] == 'last-delivered-id' then from = '(' .. g[i + 1] end
      end
    end
    while #got < n do
      local entries = redis.call('XRANGE', stream, from, '+', 'COUNT', n - #got)
      if #entries == 0 then break end
      for _, e in ipairs(entries) do
        local id = e[2][2]
        if redis.call('HGET', jkey(id), 'status') == 'pending' then
          got[#got + 1] = {tonumber(prio), tonumber(id), stream}
        end
        from = '(' .. e[1]
      end
    end
    if #got >= n then break end
  end
  return got
end

local function free_by_priority()
  for _, prio in ipairs(redis.call('ZREVRANGE', P .. 'prios', 0, -1)) do
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
end

if redis.call('ZCARD', P .. 'kready') == 0 then
  free_by_priority()
  return out
end

-- Keyed jobs take turns per key (the keys with a ready job and room, in kready's
-- order; a key served goes to the back). A key without a ready job or room leaves
-- kready (it gets a turn again when a job of it is pushed or gives its slot back).
-- The keyed job next in turn and the next job without a key are weighed, as the
-- PostgreSQL claim orders them: by priority, then turn (the first job of every key
-- before the second of any; a job without a key counts as a key of its own), then age,
-- so that neither kind waits behind the other.
local free, fi, taken = peek_free(limit), 1, {}
while #out < limit do
  local key, member
  while true do
    local head = redis.call('ZRANGE', P .. 'kready', 0, 0)
    if #head == 0 then break end
    if kroom(head[1]) > 0 then
      local first = redis.call('ZRANGE', P .. 'k:' .. head[1], 0, 0)
      if #first > 0 then
        key, member = head[1], first[1]
        break
      end
    end
    redis.call('ZREM', P .. 'kready', head[1])
  end
  local f = free[fi]
  if not key and not f then break end
  local keyed = key ~= nil
  if key and f then
    local prio = 1000000 - tonumber(string.sub(member, 1, 7))
    local turn = (taken[key] or 0) + 1
    keyed = prio > f[1] or (prio == f[1] and turn == 1 and tonumber(kid(member)) < f[2])
  end
  if keyed then
    redis.call('ZREM', P .. 'kready', key)
    redis.call('ZREM', P .. 'k:' .. key, member)
    local id = kid(member)
    if redis.call('HGET', jkey(id), 'status') == 'pending' then lease(id, 'pending') end
    taken[key] = (taken[key] or 0) + 1
    kturn(key)
  else
    take_free(f[3])
    fi = fi + 1
  end
end
return out
