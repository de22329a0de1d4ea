"""The exact cache on PostgreSQL (the default): durable, shared by every worker."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from psycopg.types.json import Jsonb

from herd.cache.base import Entry
from herd.cache.retention import PURGE_BATCH, PURGE_EVERY, Periodic
from herd.db import postgres as pgdb
from herd.jsonvalue import JSON, dumps

_GET = """
SELECT value, delta, extract(epoch FROM created_at), extract(epoch FROM expires_at),
       extract(epoch FROM now())
  FROM herd_cache
 WHERE namespace = %(ns)s AND key = %(key)s
   AND (expires_at IS NULL OR expires_at + %(stale)s * interval '1 second' > now())
"""

# A new row (xmax = 0: inserted, not updated) counts one more entry, in the same statement.
_PUT = """
WITH up AS (
    INSERT INTO herd_cache (namespace, key, value, delta, created_at, expires_at, keep_until)
    VALUES (%(ns)s, %(key)s, %(value)s, %(delta)s, now(),
            now() + %(ttl)s::float8 * interval '1 second',
            now() + (%(ttl)s::float8 + %(keep)s) * interval '1 second')
    ON CONFLICT (namespace, key) DO UPDATE
       SET value = excluded.value, delta = excluded.delta, created_at = excluded.created_at,
           expires_at = excluded.expires_at, keep_until = excluded.keep_until
    RETURNING (xmax = 0) AS inserted
)
INSERT INTO herd_cache_stats (namespace, name, value)
SELECT %(ns)s, 'entries', 1 FROM up WHERE inserted
ON CONFLICT (namespace, name) DO UPDATE SET value = herd_cache_stats.value + 1
"""

# Rows of one namespace go with the decrement of its count, in one statement: each
# touches one counter row, so concurrent deletes and purges never deadlock on them.
_DELETE = """
WITH d AS (
    DELETE FROM herd_cache
     WHERE namespace = %(ns)s AND (%(keys)s::text[] IS NULL OR key = ANY(%(keys)s))
       AND (NOT %(expired)s OR keep_until < now())
    RETURNING 1
), c AS (SELECT count(*) AS n FROM d),
u AS (
    UPDATE herd_cache_stats s SET value = s.value - c.n FROM c
     WHERE s.namespace = %(ns)s AND s.name = 'entries' AND c.n > 0
)
SELECT n FROM c
"""

# Past their keep_until (expiry plus stale window), oldest first along its index.
_EXPIRED = """
SELECT namespace, key FROM herd_cache WHERE keep_until < now()
 ORDER BY keep_until LIMIT %(limit)s
"""

_COUNT = """
INSERT INTO herd_cache_stats (namespace, name, value)
SELECT %(ns)s, n, v FROM unnest(%(names)s::text[], %(values)s::bigint[]) AS c(n, v)
ON CONFLICT (namespace, name) DO UPDATE SET value = herd_cache_stats.value + excluded.value
"""


def translate_errors(url: str) -> AbstractContextManager[None]:
    return pgdb.translate_errors(url, store="the cache")


class PostgresCacheStore:
    name = "postgres"

    def __init__(self, url: str, *, pool_size: int = 4, purge_every: float = PURGE_EVERY) -> None:
        """``purge_every``: seconds between the purges of expired entries that writes
        start (0: only ``purge()``)."""
        self.url = url
        self._pool = pgdb.SharedPool(url, max_size=pool_size, store="the cache")
        self._purges = Periodic(self.purge, "the exact cache", purge_every)

    async def open(self) -> None:
        await self._pool.open("herd.cache.sql")

    async def close(self) -> None:
        await self._purges.stop()
        await self._pool.close()

    async def _exec(self, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with translate_errors(self.url):
            async with self._pool.connection() as conn:
                cur = await conn.execute(query, params)
                return await cur.fetchall() if cur.description else []

    async def get(self, namespace: str, key: str, *, stale_for: float = 0.0) -> Entry | None:
        rows = await self._exec(_GET, {"ns": namespace, "key": key, "stale": stale_for})
        if not rows:
            return None
        value, delta, created, expires, now = rows[0]
        return Entry(
            value,
            float(delta),
            float(created),
            float(expires) if expires is not None else None,
            float(now),
        )

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
        # Rows past their ttl stay for keep_stale seconds (a stale read needs them),
        # then the purge that writes start takes them.
        self._purges.due()
        dumps(value, what="cache value")
        params = {"ns": namespace, "key": key, "value": Jsonb(value), "delta": delta, "ttl": ttl,
                  "keep": keep_stale}  # fmt: skip
        await self._exec(_PUT, params)

    async def _delete(self, namespace: str, keys: list[str] | None, *, expired: bool) -> int:
        params = {"ns": namespace, "keys": keys, "expired": expired}
        return int((await self._exec(_DELETE, params))[0][0])

    async def delete(self, namespace: str, key: str) -> None:
        await self._delete(namespace, [key], expired=False)

    async def clear(self, namespace: str | None = None) -> int:
        if namespace is not None:
            return await self._delete(namespace, None, expired=False)
        rows = await self._exec(
            "SELECT namespace FROM herd_cache_stats WHERE name = 'entries' ORDER BY namespace", {}
        )
        return sum([await self._delete(ns, None, expired=False) for (ns,) in rows])

    async def purge(self, *, batch: int = PURGE_BATCH) -> int:
        """Delete the entries past their expiry and stale window, ``batch`` at a time,
        oldest first; returns how many went."""
        removed = 0
        while True:
            rows = await self._exec(_EXPIRED, {"limit": batch})
            by_ns: dict[str, list[str]] = {}
            for ns, key in rows:
                by_ns.setdefault(ns, []).append(key)
            for ns in sorted(by_ns):  # rechecked there: a row rewritten since stays
                removed += await self._delete(ns, by_ns[ns], expired=True)
            if len(rows) < batch:
                return removed

    async def count(self, amounts: dict[str, int], namespace: str) -> None:
        amounts = {k: v for k, v in amounts.items() if v}
        if amounts:
            await self._exec(
                _COUNT, {"ns": namespace, "names": list(amounts), "values": list(amounts.values())}
            )

    async def stats(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        # 'entries' is one of these rows, kept by every write: O(namespaces), no count(*).
        # It counts rows stored, expired ones included until the next purge.
        for ns, name, value in await self._exec(
            "SELECT namespace, name, value FROM herd_cache_stats", {}
        ):
            out.setdefault(ns, {})[name] = int(value)
        return out
