"""Fenced locks on Redis: one Lua script per verb, expiry by Redis's own clock (PX).

Layout, both keys under the hash tag ``{name}`` so they share a Redis Cluster slot
and one script can touch both:

    herd:lock:{name}       the lock: SET <token> PX <ttl>; gone once expired or released
    herd:lock:{name}:seq   the last token; never expires, so tokens keep growing across
                           holders and expiries (and past a failover: the clock floor)

The value is the bare token, so a lease's owner lives only on the client side.
A token is at least the server's clock in microseconds, so a failover to a replica
that missed the last acquisitions does not hand out a token again (as long as the
nodes' clocks differ by less than the failover took); a lost acquisition itself
is lost (the lock is free on the new master).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import redis.asyncio as aioredis

from herd.db import redis as rdb
from herd.locks.base import BaseLocks, LockLease

CHANNEL = "herd:locks:released"  # payload: the lock name; a hint for waiters

# A token is never 0 (INCR starts at 1), so 0 says "held" in RESP2 and RESP3 alike.
# A token is never below the server's clock in microseconds: after a failover that
# lost the last acquisitions (asynchronous replication), the promoted replica still
# hands out tokens past every one the old master gave (docs/cluster.md).
# KEYS: the lock (its token, PX ttl), the token sequence, the holder's owner (same PX).
_ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  if ARGV[3] ~= '1' or redis.call('GET', KEYS[3]) ~= ARGV[2] then return 0 end
end
local t = redis.call('TIME')
local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
local token = string.format('%d', math.max((tonumber(redis.call('GET', KEYS[2])) or 0) + 1, floor))
redis.call('SET', KEYS[2], token)
redis.call('SET', KEYS[1], token, 'PX', ARGV[1])
redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[1])
return tonumber(token)
"""

_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
"""


def lock_key(name: str) -> str:
    # Names without braces (refused earlier, as is the empty name) make {name}
    # the hash tag of both keys.
    return f"herd:lock:{{{name}}}"


def seq_key(name: str) -> str:
    return lock_key(name) + ":seq"


def owner_key(name: str) -> str:
    return lock_key(name) + ":owner"


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


class RedisLocks(BaseLocks):
    """Fenced locks on Redis. Give a URL (the process's pool for it is joined on
    ``open()``) or a ``redis.asyncio.Redis`` client you own; RESP2 and RESP3, bytes or
    decoded, all work.
    """

    def __init__(
        self,
        redis: str | aioredis.Redis,
        *,
        owner: str | None = None,
        poll_interval: float = 0.2,
        pool_size: int = 4,
    ) -> None:
        super().__init__(owner=owner, poll_interval=poll_interval)
        self._shared: rdb.SharedClient | None = None
        if isinstance(redis, str):
            self._where = redis
            self._shared = rdb.SharedClient(redis, store="the lock store", max_size=pool_size)
            self._own: Any = None
            self._owns_client = True
            # Through the shared client: on a cluster it swaps in a RedisCluster on open.
            scripts: Any = self._shared
        else:
            kw = redis.connection_pool.connection_kwargs
            self._where = f"{kw.get('host', '?')}:{kw.get('port', '?')}"
            self._own = scripts = redis
            self._owns_client = False
        self._acquire_script = scripts.register_script(_ACQUIRE)
        self._renew_script = scripts.register_script(_RENEW)
        self._release_script = scripts.register_script(_RELEASE)

    @property
    def _redis(self) -> Any:
        return self._shared.client if self._shared is not None else self._own

    def _errors(self) -> AbstractContextManager[None]:
        return rdb.translate_errors(self._where, store="the lock store")

    async def open(self) -> None:
        if self._shared is not None:
            return await self._shared.open()
        with self._errors():
            await self._redis.ping()

    async def close(self) -> None:
        await super().close()
        if self._shared is not None:
            await self._shared.close()

    async def _try_acquire(
        self, name: str, ttl: float, owner: str, take_over: bool = False
    ) -> int | None:
        with self._errors():
            token = await self._acquire_script(
                keys=[lock_key(name), seq_key(name), owner_key(name)],
                args=[_ms(ttl), owner, "1" if take_over else "0"],
            )
        return int(token) or None

    async def renew(self, lease: LockLease) -> bool:
        with self._errors():
            done = await self._renew_script(
                keys=[lock_key(lease.name), owner_key(lease.name)],
                args=[lease.token, _ms(lease.ttl)],
            )
        return int(done) == 1

    async def release(self, lease: LockLease) -> bool:
        with self._errors():
            done = await self._release_script(
                keys=[lock_key(lease.name), owner_key(lease.name)],
                args=[lease.token, CHANNEL, lease.name],
            )
        return int(done) == 1

    async def check(self, lease: LockLease) -> bool:
        with self._errors():
            value = await self._redis.get(lock_key(lease.name))
        return _text(value) == str(lease.token)

    async def _listen(self) -> None:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(CHANNEL)
            async for message in pubsub.listen():
                if message.get("type") == "message":
                    name = _text(message["data"])
                    if name:
                        self._wake(name)
        finally:
            await pubsub.aclose()
