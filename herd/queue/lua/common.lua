-- Shared by every herd script (prepended to each). All keys of a queue share the
-- hash tag {queue}, so each script touches one Redis Cluster slot. Time comes
-- from the server (TIME), never from a client.
local P = ARGV[1]                -- key prefix, "herd:{queue}:"
local GROUP = 'herd'
-- TP_KEEP (seconds a per-minute throughput hash is kept, 0: for good) is defined
-- above this file by herd.queue.redis, from HERD_THROUGHPUT_TTL.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function jkey(id) return P .. 'job:' .. id end
local function lkey(id) return P .. 'lease:' .. id end

-- Concurrency keys (herd:{q}:k:<key>, :kready, :krun, :kwait, :kmax, :kseq; see
-- herd.queue.redis). A keyed job never enters a priority stream: while ready it waits
-- in its key's sorted set, whose members (score 0) compare as text in priority then id
-- order; kready holds the keys with a ready job and room, by turn (kseq).
local function kmember(id, prio)
  return string.format('%07d', 1000000 - tonumber(prio)) .. ':' .. string.rep('0', 16 - #id) .. id
end

local function kid(member) return string.match(member, '^%d+:0*(%d+)$') end

-- Counters per key; a field at 0 goes (the hashes hold the keys with work only), and
-- the key's limit with the last of them. kwaitz ranks the keys by waiting jobs, so
-- that the busiest are read without reading every key (key_stats.lua).
local function kinc(hash, key, by)
  local n = redis.call('HINCRBY', P .. hash, key, by)
  if hash == 'kwait' then
    if n > 0 then
      redis.call('ZADD', P .. 'kwaitz', n, key)
    else
      redis.call('ZREM', P .. 'kwaitz', key)
    end
  end
  if n <= 0 then
    redis.call('HDEL', P .. hash, key)
    if redis.call('HEXISTS', P .. 'krun', key) == 0
        and redis.call('HEXISTS', P .. 'kwait', key) == 0 then
      redis.call('HDEL', P .. 'kmax', key)
    end
  end
end

local function kroom(key)
  return (tonumber(redis.call('HGET', P .. 'kmax', key)) or 1)
    - (tonumber(redis.call('HGET', P .. 'krun', key)) or 0)
end

-- Give the key a turn, at the back, if it has a ready job and room (none while it has one).
local function kturn(key)
  if redis.call('ZCARD', P .. 'k:' .. key) > 0 and kroom(key) > 0 then
    redis.call('ZADD', P .. 'kready', 'NX', redis.call('INCR', P .. 'kseq'), key)
  end
end

-- Active jobs are scored by id; finished ones by finish time (finish below), so
-- that a sweep walks the expired ones oldest first and a count by score range
-- leaves out those whose hash has expired but not yet been swept. Every change of
-- status passes here, so a keyed job's counters follow it exactly: a slot is given
-- back by whatever moves the job out of processing, once.
local function set_status(id, old, new, score)
  redis.call('ZREM', P .. 'st:' .. old, id)
  redis.call('ZADD', P .. 'st:' .. new, score or id, id)
  redis.call('HSET', jkey(id), 'status', new)
  if old ~= new then
    local key = redis.call('HGET', jkey(id), 'ckey')
    if key and key ~= '' then
      -- Up before down: a key's limit goes with its last counter.
      if new == 'pending' then kinc('kwait', key, 1) end
      if new == 'processing' then kinc('krun', key, 1) end
      if old == 'pending' then kinc('kwait', key, -1) end
      if old == 'processing' then
        kinc('krun', key, -1)
        kturn(key)
      end
    end
  end
end

-- Append the job to its priority's stream (one stream and consumer group per
-- priority), or a keyed job to its key's set.
local function push(id)
  local prio, key = unpack(redis.call('HMGET', jkey(id), 'priority', 'ckey'))
  if key and key ~= '' then
    redis.call('ZADD', P .. 'k:' .. key, 0, kmember(id, prio))
    kturn(key)
    return
  end
  local stream = P .. 's:' .. prio
  if not redis.call('ZSCORE', P .. 'prios', prio) then
    redis.pcall('XGROUP', 'CREATE', stream, GROUP, '0', 'MKSTREAM')
    redis.call('ZADD', P .. 'prios', prio, prio)
  end
  local entry = redis.call('XADD', stream, '*', 'id', id)
  redis.call('HSET', jkey(id), 'entry', entry)
end

-- Acknowledge and drop the job's stream entry, if it has one; a keyed job leaves its
-- key's set (a ready one rescheduled; a claimed one has left it already).
local function ack(id)
  local entry, prio, key = unpack(redis.call('HMGET', jkey(id), 'entry', 'priority', 'ckey'))
  if key and key ~= '' then
    redis.call('ZREM', P .. 'k:' .. key, kmember(id, prio))
  end
  if entry and entry ~= '' then
    local stream = P .. 's:' .. prio
    redis.call('XACK', stream, GROUP, entry)
    redis.call('XDEL', stream, entry)
    redis.call('HSET', jkey(id), 'entry', '')
  end
end

-- Liveness marks: herd:{q}:owners maps a worker (owner) to the CLIENT ID of the
-- connection it holds open (herd.db.redis.HeldConnection), and herd:{q}:owned:<owner>
-- holds the ids of its jobs, so that a claim finds a dead worker's jobs without a
-- scan. A job leased without a mark (live '') is in neither.
local function own(id, owner, live)
  redis.call('HSET', jkey(id), 'live', live)
  if live ~= '' then
    redis.call('SADD', P .. 'owned:' .. owner, id)
    redis.call('HSET', P .. 'owners', owner, live)
  end
end

local function disown(id)
  local owner, live = unpack(redis.call('HMGET', jkey(id), 'owner', 'live'))
  if live and live ~= '' and owner and owner ~= '' then
    local owned = P .. 'owned:' .. owner
    redis.call('SREM', owned, id)
    if redis.call('SCARD', owned) == 0 then redis.call('HDEL', P .. 'owners', owner) end
    redis.call('HSET', jkey(id), 'live', '')
  end
end

local function drop_lease(id)
  disown(id)
  redis.call('DEL', lkey(id))
  redis.call('ZREM', P .. 'leases', id)
  redis.call('HSET', jkey(id), 'lease_expires_at', '')
end

local function free_dedup(id)
  local key = redis.call('HGET', jkey(id), 'dedup_key')
  if key and key ~= '' and redis.call('GET', P .. 'dedup:' .. key) == id then
    redis.call('DEL', P .. 'dedup:' .. key)
  end
end

local function finish(id, old, new, now)
  ack(id)
  drop_lease(id)
  free_dedup(id)
  set_status(id, old, new, now)
  redis.call('HSET', jkey(id), 'finished_at', now)
  -- Jobs finished per minute (dashboards): a small hash per minute that expires by
  -- itself, since job hashes (and their finished_at) may expire before anyone reads them.
  local minute = P .. 'tp:' .. math.floor(now / 60000)
  redis.call('HINCRBY', minute, new, 1)
  if TP_KEEP > 0 then redis.call('EXPIRE', minute, TP_KEEP) end
end

local function dead(id, old, reason, now)
  finish(id, old, 'dead', now)
  redis.call('HSET', jkey(id), 'dead_reason', reason)
  redis.call('XADD', P .. 'dlq', 'MAXLEN', '~', '10000', '*', 'id', id, 'reason', reason)
end

-- Is (id, token) the live lease? The lease key expires by itself (PX), so an
-- expired lease fails this check even before anyone takes the job over.
local function held(id, token)
  return redis.call('GET', lkey(id)) == token
end

local function requeue(id, old, delay, now)
  ack(id)
  drop_lease(id)
  set_status(id, old, 'pending')
  redis.call('HSET', jkey(id), 'run_at', now + delay, 'owner', '')
  if delay > 0 then
    redis.call('ZADD', P .. 'delayed', now + delay, id)
  else
    push(id)
  end
end
