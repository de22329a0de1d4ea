"""The exact cache on PostgreSQL (the default): durable, shared by every worker."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from psycopg.types.json import Jsonb

from herd.cache.base import Entry
from herd.db import postgres as pgdb
from herd.jsonvalue import JSON, dumps

_GET = """
SELECT value, delta, extract(epoch FROM created_at), extract(epoch FROM expires_at),
       extract(epoch FROM now())
  FROM herd_cache
 WHERE namespace = %(ns)s AND key = %(key)s
   AND (expires_at IS NULL OR expires_at + %(stale)s * interval '1 second' > now())
"""

_PUT = """
INSERT INTO herd_cache (namespace, key, value, delta, created_at, expires_at)
VALUES (%(ns)s, %(key)s, %(value)s, %(delta)s, now(),
        now() + %(ttl)s::float8 * interval '1 second')
ON CONFLICT (namespace, key) DO UPDATE
   SET value = excluded.value, delta = excluded.delta, created_at = excluded.created_at,
       expires_at = excluded.expires_at
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

    def __init__(self, url: str, *, pool_size: int = 4) -> None:
        self.url = url
        self._pool = pgdb.SharedPool(url, max_size=pool_size, store="the cache")

    async def open(self) -> None:
        await self._pool.open("herd.cache.sql")

    async def close(self) -> None:
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
        # Rows past their ttl stay until overwritten or cleared: a stale read needs them.
        dumps(value, what="cache value")
        params = {"ns": namespace, "key": key, "value": Jsonb(value), "delta": delta, "ttl": ttl}
        await self._exec(_PUT, params)

    async def delete(self, namespace: str, key: str) -> None:
        await self._exec(
            "DELETE FROM herd_cache WHERE namespace = %(ns)s AND key = %(key)s",
            {"ns": namespace, "key": key},
        )

    async def clear(self, namespace: str | None = None) -> int:
        rows = await self._exec(
            "WITH d AS (DELETE FROM herd_cache WHERE %(ns)s::text IS NULL OR namespace = %(ns)s"
            " RETURNING 1) SELECT count(*) FROM d",
            {"ns": namespace},
        )
        return int(rows[0][0])

    async def count(self, amounts: dict[str, int], namespace: str) -> None:
        amounts = {k: v for k, v in amounts.items() if v}
        if amounts:
            await self._exec(
                _COUNT, {"ns": namespace, "names": list(amounts), "values": list(amounts.values())}
            )

    async def stats(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for ns, name, value in await self._exec(
            "SELECT namespace, name, value FROM herd_cache_stats", {}
        ):
            out.setdefault(ns, {})[name] = int(value)
        for ns, n in await self._exec(
            "SELECT namespace, count(*) FROM herd_cache GROUP BY namespace", {}
        ):
            out.setdefault(ns, {})["entries"] = int(n)
        return out
