"""The exact cache on Redis: one JSON string per key, expiring by itself (PX)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from herd.cache.base import Entry
from herd.config import Settings
from herd.db import redis as rdb
from herd.errors import ConfigError
from herd.jsonvalue import JSON, dumps
from herd.names import hash_tag, tagged

NAMESPACES = "herd:cache:namespaces"


def glob_literal(text: str) -> str:
    """``text`` as a SCAN/KEYS pattern that matches itself only.

    A name is user text: unescaped, the ``*`` of a cache named ``a*`` would match
    every cache whose name starts with ``a``, and its clear would delete their keys.
    """
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _tag(namespace: str) -> str:
    return hash_tag(namespace, "cache namespace", "namespace")


def _key(namespace: str, key: str) -> str:
    return f"herd:cache:{_tag(namespace)}:k:{key}"


def _stats_key(namespace: str) -> str:
    return f"herd:cache:{_tag(namespace)}:stats"


def _expiry_key(namespace: str) -> str:
    """A sorted set of the namespace's keys by when they go (ms, server time; +inf:
    never): trimmed of the past, its size is the number of entries, in O(log n)."""
    return f"herd:cache:{_tag(namespace)}:expiry"


def _indexed_key(namespace: str) -> str:
    return f"herd:cache:{_tag(namespace)}:indexed"


# Trim and count on the server's clock, in one step, so that the count is exact.
_ENTRIES = """
local t = redis.call('TIME')
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (t[1] * 1000 + math.floor(t[2] / 1000)))
return redis.call('ZCARD', KEYS[1])
"""


# The value and the clock of the server that holds it, in one round trip (a
# pipeline of GET and TIME cannot run on a cluster: TIME names no key).
_GET = """
return {redis.call('GET', KEYS[1]), redis.call('TIME')}
"""


class RedisCacheStore:
    name = "redis"

    def __init__(self, url: str, *, pool_size: int = 4) -> None:
        self.url = url
        self._client = rdb.SharedClient(url, store="the cache", max_size=pool_size)
        self._entries = self._client.register_script(_ENTRIES)
        self._get = self._client.register_script(_GET)

    @property
    def _redis(self) -> Any:
        """The process's client for the URL: a ``RedisCluster`` on a cluster, once open."""
        return self._client.client

    async def _do(self, coro: Any) -> Any:
        with rdb.translate_errors(self.url, store="the cache"):
            return await coro

    async def open(self) -> None:
        await self._client.open()
        await self._do(self._index_older_entries())

    async def _index_older_entries(self) -> None:
        """Entries written before the expiry index existed join it, once per namespace
        (a SCAN at open, never on a read path)."""
        for ns in tagged(await self._redis.smembers(NAMESPACES)):
            if await self._redis.exists(_indexed_key(ns)):
                continue
            keys = await self._keys(ns)
            sec, usec = await self._redis.time()
            now_ms = int(sec) * 1000 + int(usec) // 1000
            for start in range(0, len(keys), 1000):
                chunk = keys[start : start + 1000]
                pipe = self._redis.pipeline(transaction=False)
                for k in chunk:
                    pipe.pttl(k)
                ttls = await pipe.execute()
                scores = {
                    k[len(_key(ns, "")) :]: (now_ms + t if t >= 0 else float("inf"))
                    for k, t in zip(chunk, ttls, strict=True)
                    if t != -2  # gone meanwhile
                }
                if scores:
                    await self._redis.zadd(_expiry_key(ns), scores)
            await self._redis.set(_indexed_key(ns), "1")

    async def close(self) -> None:
        await self._client.close()

    async def get(self, namespace: str, key: str, *, stale_for: float = 0.0) -> Entry | None:
        raw, (sec, usec) = await self._do(self._get(keys=[_key(namespace, key)]))
        if raw is None:
            return None
        doc = json.loads(raw)
        now = int(sec) + int(usec) / 1e6
        expires = doc["e"]
        if expires is not None and now >= expires + stale_for:
            return None
        return Entry(doc["v"], float(doc["d"]), float(doc["c"]), expires, now)

    async def put(
        self,
        namespace: str,
        key: str,
        value: JSON,
        *,
        delta: float,
        ttl: float | None,
        keep_stale: float = 0.0,
    ) -> None:
        sec, usec = await self._do(self._redis.time())
        now = int(sec) + int(usec) / 1e6
        doc = {"v": value, "d": delta, "c": now, "e": now + ttl if ttl is not None else None}
        text = dumps(doc, what="cache value")
        px = int((ttl + keep_stale) * 1000) if ttl is not None else None
        gone = int(now * 1000) + px if px is not None else float("inf")
        pipe = self._redis.pipeline(transaction=False)
        # The index first: were the SET lost, the member still leaves at its score.
        pipe.zadd(_expiry_key(namespace), {key: gone})
        pipe.set(_key(namespace, key), text, px=px)
        pipe.zremrangebyscore(_expiry_key(namespace), "-inf", f"({int(now * 1000)}")
        pipe.sadd(NAMESPACES, namespace)
        await self._do(pipe.execute())

    async def delete(self, namespace: str, key: str) -> None:
        pipe = self._redis.pipeline(transaction=False)
        pipe.delete(_key(namespace, key))
        pipe.zrem(_expiry_key(namespace), key)
        await self._do(pipe.execute())

    async def _keys(self, namespace: str) -> list[str]:
        pattern = _key(glob_literal(namespace), "*")
        return [k async for k in self._redis.scan_iter(match=pattern, count=1000)]

    async def clear(self, namespace: str | None = None) -> int:
        namespaces = (
            [namespace] if namespace else tagged(await self._do(self._redis.smembers(NAMESPACES)))
        )
        removed = 0
        for ns in namespaces:
            keys = await self._do(self._keys(ns))
            for start in range(0, len(keys), 1000):
                chunk = keys[start : start + 1000]
                pipe = self._redis.pipeline(transaction=False)
                # As one command: the keys share the namespace's slot, and a cluster
                # pipeline's own unlink() would split them outside the pipeline.
                pipe.execute_command("UNLINK", *chunk)
                pipe.zrem(_expiry_key(ns), *[k[len(_key(ns, "")) :] for k in chunk])
                removed += (await self._do(pipe.execute()))[0]
        return removed

    async def count(self, amounts: dict[str, int], namespace: str) -> None:
        pipe = self._redis.pipeline(transaction=False)
        for name, n in amounts.items():
            if n:
                pipe.hincrby(_stats_key(namespace), name, n)
        pipe.sadd(NAMESPACES, namespace)
        await self._do(pipe.execute())

    async def stats(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for ns in tagged(await self._do(self._redis.smembers(NAMESPACES))):
            counters = await self._do(self._redis.hgetall(_stats_key(ns)))
            out[ns] = {k: int(v) for k, v in counters.items()}
            # From the expiry index, not a SCAN: O(log n) whatever the keyspace holds.
            # Expired entries count while they are kept for stale-while-revalidate.
            out[ns]["entries"] = int(await self._do(self._entries(keys=[_expiry_key(ns)])))
        return out


def home(settings: Settings, database_url: Callable[[], str]) -> str:
    """HERD_CACHE=redis: the server HERD_REDIS_URL names."""
    if not settings.redis_url:
        raise ConfigError("HERD_CACHE=redis needs HERD_REDIS_URL")
    return settings.redis_url
