"""Provider limits on Redis: one Lua script per verb, by Redis's own clock (TIME).

Layout, both keys of a scope under the hash tag ``{scope}`` (one Cluster slot):

    herd:limit:{scope}         hash: rtat, ttat (GCRA state), paused, counters, lim (JSON),
                               flows (JSON: fair shares, as 5002_fair_shares.sql), flows_at
    herd:limit:{scope}:slots   sorted set: concurrency holder -> expiry (epoch seconds)
    herd:limits                sorted set: scope -> when last seen (for stats() of all);
                               its own key, written by a second command only when a
                               scope is new or was last seen over an hour ago

Every key of a scope gets a TTL of LIMIT_TTL on each write: a scope unused for a
day disappears, and stats() drops it from the index.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from herd.db import redis as rdb
from herd.limits.base import (
    LIMIT_TTL,
    Grant,
    Limit,
    LimitStats,
    Share,
    ShareArgs,
    check_request,
    check_scope,
    pause_seconds,
    rates,
    stats_of,
)

STORE = "the limit store"
INDEX = "herd:limits"
_SEEN_EVERY = 3600

# Shared head of every script: the clock, and whether the index needs this scope.
_CLOCK = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ttl = tonumber(ARGV[1])
local function seen()
  local s = tonumber(redis.call('HGET', KEYS[1], 'seen'))
  if s == nil or now - s > SEEN_EVERY then
    redis.call('HSET', KEYS[1], 'seen', string.format('%.6f', now))
    return 1
  end
  return 0
end
local function keep()
  redis.call('EXPIRE', KEYS[1], ttl)
  if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('EXPIRE', KEYS[2], ttl) end
end
""".replace("SEEN_EVERY", str(_SEEN_EVERY))

# ARGV: ttl, tokens, holder, hold, req_burst, req_rate, tok_burst, tok_rate,
# max_concurrent, lim ('' where a dimension is not limited), then the share: flow ('' for
# none), weight, cost, window, grace, linger, tick, forget (the arithmetic of
# 5002_fair_shares.sql).
# Returns {granted, wait, at, reason, seen}; floats as strings (Lua numbers would be
# truncated to integers on the way out).
_ACQUIRE = (
    _CLOCK
    + """
local tokens = tonumber(ARGV[2])
local holder = ARGV[3]
local hold = tonumber(ARGV[4])
local rb, rr = tonumber(ARGV[5]), tonumber(ARGV[6])
local tb, tr = tonumber(ARGV[7]), tonumber(ARGV[8])
local maxc = tonumber(ARGV[9])
local flow = ARGV[11]
local h = redis.call('HMGET', KEYS[1], 'rtat', 'ttat', 'paused', 'flows', 'flows_at')
local rtat = tonumber(h[1]) or -math.huge
local ttat = tonumber(h[2]) or -math.huge
local paused = tonumber(h[3]) or 0
local wait, reason = 0, false
local function refuse(w, why)
  if reason ~= 'paused' and w > wait then reason = why end
  if w > wait then wait = w end
  if not reason then reason = why end
end
if paused > now then wait = paused - now; reason = 'paused' end
if maxc then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  local held = redis.call('ZCARD', KEYS[2])
  if redis.call('ZSCORE', KEYS[2], holder) then held = held - 1 end
  if held >= maxc then
    local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    refuse(tonumber(first[2]) - now, 'concurrency')
  end
end
if rr then
  local w = rtat + (1 - rb) / rr - now
  if w > 0 then refuse(w, 'requests') end
end
if tr and tokens > 0 then
  local w = ttat + (tokens - tb) / tr - now
  if w > 0 then refuse(w, 'tokens') end
end
if flow ~= '' then
  local weight, cost = tonumber(ARGV[12]), tonumber(ARGV[13])
  local window, grace = tonumber(ARGV[14]), tonumber(ARGV[15])
  local linger, tick, forget = tonumber(ARGV[16]), tonumber(ARGV[17]), tonumber(ARGV[18])
  local old = h[4] and cjson.decode(h[4]) or {}
  local decay = math.exp(-math.max(0, now - (tonumber(h[5]) or now)) / window)
  local flows = {}
  for name, f in pairs(old) do
    if name == flow or now - f.s <= forget then
      flows[name] = {w = f.w, u = f.u * decay, s = f.s, x = f.x}
    end
  end
  local mine = flows[flow] or {u = 0, x = 0}
  if not reason then
    for name, f in pairs(flows) do
      if name ~= flow and f.x >= now and (f.u + cost) / f.w < (mine.u + cost) / weight then
        reason = 'share'; wait = tick
        break
      end
    end
  end
  if reason then
    mine.x = math.max(mine.x, now + wait + grace)
  else
    mine.u = mine.u + cost
    mine.x = math.min(mine.x, now + linger)
  end
  flows[flow] = {w = weight, u = mine.u, s = now, x = mine.x}
  redis.call('HSET', KEYS[1], 'flows', cjson.encode(flows), 'flows_at', string.format('%.6f', now))
  keep()
end
local at = string.format('%.6f', now)
if reason then return {0, string.format('%.6f', wait), at, reason, 0} end
if rr then
  redis.call('HSET', KEYS[1], 'rtat', string.format('%.17g', math.max(rtat, now) + 1 / rr))
end
if tr then
  redis.call('HSET', KEYS[1], 'ttat', string.format('%.17g', math.max(ttat, now) + tokens / tr))
end
if maxc then redis.call('ZADD', KEYS[2], now + hold, holder) end
redis.call('HINCRBY', KEYS[1], 'requests', 1)
redis.call('HINCRBY', KEYS[1], 'tokens', tokens)
redis.call('HSET', KEYS[1], 'lim', ARGV[10])
local fresh = seen()
keep()
return {1, '0', at, '', fresh}
"""
)

# ARGV: ttl, holder, hold
_RENEW = (
    _CLOCK
    + """
local expiry = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[2]))
if expiry == nil or expiry <= now then return 0 end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[2])
return 1
"""
)

# ARGV: ttl, tokens, rate ('' when tokens are not limited)
_ADJUST = (
    _CLOCK
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local tokens = tonumber(ARGV[2])
local rate = tonumber(ARGV[3])
redis.call('HINCRBY', KEYS[1], 'tokens', tokens)
if rate then
  local tat = tonumber(redis.call('HGET', KEYS[1], 'ttat')) or -math.huge
  if tokens >= 0 then
    tat = math.max(tat, now) + tokens / rate
  elseif tat > now then
    tat = math.max(tat + tokens / rate, now)
  end
  if tat > -math.huge then redis.call('HSET', KEYS[1], 'ttat', string.format('%.17g', tat)) end
end
keep()
return 0
"""
)

# ARGV: ttl, seconds, 429s to count (0: a refused key)
_PAUSE = (
    _CLOCK
    + """
local old = tonumber(redis.call('HGET', KEYS[1], 'paused')) or 0
redis.call('HSET', KEYS[1], 'paused', string.format('%.6f', math.max(old, now + tonumber(ARGV[2]))))
redis.call('HINCRBY', KEYS[1], 'rate_limited', tonumber(ARGV[3]))
local fresh = seen()
keep()
return fresh
"""
)

# ARGV: ttl, seconds
_NOTE_WAIT = (
    _CLOCK
    + """
redis.call('HINCRBY', KEYS[1], 'waits', 1)
redis.call('HINCRBYFLOAT', KEYS[1], 'wait_seconds', ARGV[2])
local fresh = seen()
keep()
return fresh
"""
)

# Returns {now, hash fields..., live slots}
_STATS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local h = redis.call('HMGET', KEYS[1], 'lim', 'rtat', 'ttat', 'paused', 'requests', 'tokens',
                     'waits', 'wait_seconds', 'rate_limited', 'flows', 'flows_at')
local live = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
return {string.format('%.6f', now), h[1] or false, h[2] or false, h[3] or false, h[4] or false,
        h[5] or false, h[6] or false, h[7] or false, h[8] or false, h[9] or false, live,
        h[10] or false, h[11] or false}
"""


def limit_key(scope: str) -> str:
    return f"herd:limit:{{{scope}}}"


def slots_key(scope: str) -> str:
    return limit_key(scope) + ":slots"


def _keys(scope: str) -> list[str]:
    return [limit_key(scope), slots_key(scope)]


def _arg(value: float | int | None) -> str:
    return "" if value is None else repr(value)


def _num(value: Any, default: float = 0.0) -> float:
    return default if value is None or value is False or value == "" else float(value)


class RedisLimiter:
    """Limits in Redis. Give a URL: the process's pool for it is joined on ``open()``."""

    name = "redis"

    def __init__(self, url: str, *, pool_size: int = 4, ttl: int = LIMIT_TTL) -> None:
        self.url = url
        self.ttl = ttl
        self._shared = rdb.SharedClient(url, store=STORE, max_size=pool_size)
        r = self._shared  # scripts run on its client of the moment (a cluster's, once open)
        self._acquire, self._renew = r.register_script(_ACQUIRE), r.register_script(_RENEW)
        self._adjust, self._pause = r.register_script(_ADJUST), r.register_script(_PAUSE)
        self._note_wait, self._stats = r.register_script(_NOTE_WAIT), r.register_script(_STATS)

    @property
    def _redis(self) -> Any:
        """The process's client for the URL: a ``RedisCluster`` on a cluster, once open."""
        return self._shared.client

    def _errors(self) -> AbstractContextManager[None]:
        return rdb.translate_errors(self.url, store=STORE)

    async def open(self) -> None:
        await self._shared.open()

    async def close(self) -> None:
        await self._shared.close()

    async def __aenter__(self) -> RedisLimiter:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _seen(self, scope: str, fresh: Any) -> None:
        if int(fresh):
            with self._errors():
                await self._redis.zadd(INDEX, {scope: _num((await self._redis.time())[0])})

    async def try_acquire(
        self,
        scope: str,
        limit: Limit,
        tokens: int,
        holder: str,
        hold_for: float,
        share: Share | None = None,
    ) -> Grant:
        check_request(scope, limit, tokens, hold_for)
        req, tok = rates(limit)
        fair = ShareArgs.of(share, limit, tokens)
        args: list[str | int] = [
            self.ttl,
            tokens,
            holder,
            _arg(hold_for),
            _arg(req.burst if req else None),
            _arg(req.rate if req else None),
            _arg(tok.burst if tok else None),
            _arg(tok.rate if tok else None),
            _arg(limit.max_concurrent),
            json.dumps(limit.to_json()),
            fair.flow or "",
            _arg(fair.weight),
            _arg(fair.cost),
            _arg(fair.window),
            _arg(fair.grace),
            _arg(fair.linger),
            _arg(fair.tick),
            _arg(fair.forget),
        ]
        with self._errors():
            granted, wait, at, reason, fresh = await self._acquire(keys=_keys(scope), args=args)
        await self._seen(scope, fresh)
        return Grant(bool(int(granted)), float(wait), float(at), reason or None)

    async def renew(self, scope: str, holder: str, hold_for: float) -> bool:
        with self._errors():
            done = await self._renew(keys=_keys(scope), args=[self.ttl, holder, _arg(hold_for)])
        return int(done) == 1

    async def release(self, scope: str, holder: str) -> None:
        with self._errors():
            await self._redis.zrem(slots_key(scope), holder)

    async def adjust(self, scope: str, limit: Limit, tokens: int) -> None:
        if tokens:
            _, tok = rates(limit)
            with self._errors():
                await self._adjust(
                    keys=_keys(scope), args=[self.ttl, tokens, _arg(tok.rate if tok else None)]
                )

    async def pause(self, scope: str, seconds: float, *, rate_limited: bool = True) -> None:
        check_scope(scope)
        with self._errors():
            fresh = await self._pause(
                keys=_keys(scope),
                args=[self.ttl, _arg(pause_seconds(seconds)), int(rate_limited)],
            )
        await self._seen(scope, fresh)

    async def note_wait(self, scope: str, seconds: float) -> None:
        check_scope(scope)
        with self._errors():
            fresh = await self._note_wait(
                keys=_keys(scope), args=[self.ttl, _arg(max(0.0, seconds))]
            )
        await self._seen(scope, fresh)

    async def stats(self, scopes: Sequence[str] | None = None) -> list[LimitStats]:
        with self._errors():
            if scopes is None:
                scopes = [str(s) for s in await self._redis.zrange(INDEX, 0, -1)]
            gone, out = [], []
            for scope in sorted(set(scopes)):
                raw = await self._stats(keys=_keys(scope), args=[])
                if not raw:
                    gone.append(scope)
                    continue
                now, lim, rtat, ttat, paused, req, tok, waits, wait_s, limited, live = raw[:11]
                flows, flows_at = raw[11:13]
                out.append(
                    stats_of(
                        scope,
                        json.loads(lim) if lim else {},
                        float(now),
                        req_tat=_num(rtat, float("-inf")),
                        tok_tat=_num(ttat, float("-inf")),
                        paused_until=_num(paused) or None,
                        requests=int(_num(req)),
                        tokens=int(_num(tok)),
                        waits=int(_num(waits)),
                        wait_seconds=_num(wait_s),
                        rate_limited=int(_num(limited)),
                        in_flight=int(live),
                        flows=json.loads(flows) if flows else None,
                        flows_at=_num(flows_at) if flows_at else None,
                    )
                )
            if gone:
                # Expired scopes leave the index here: it stays as small as the live ones.
                await self._redis.zrem(INDEX, *gone)
        return out
