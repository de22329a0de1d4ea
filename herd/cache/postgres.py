"""The exact cache on PostgreSQL (the default): durable, shared by every worker."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from psycopg.types.json import Jsonb

from herd.cache.base import Entry
from herd.cache.retention import PURGE_BATCH, PURGE_EVERY, Periodic
from herd.config import Settings
from herd.db import postgres as pgdb
from herd.db.queries import named
from herd.jsonvalue import JSON, dumps

Q = named("herd.cache.sql")


def translate_errors(url: str) -> AbstractContextManager[None]:
    return pgdb.translate_errors(url, store="the cache")


class PostgresCacheStore:
    name = "postgres"

    def __init__(self, url: str, *, pool_size: int = 4, purge_every: float = PURGE_EVERY) -> None:
        """``purge_every``: seconds between the purges of expired entries that writes
        start (0: only ``purge()``)."""
        self.url = url
        self._pool = pgdb.SharedPool(
            url, max_size=pool_size, store="the cache", unchecked_if_fresh=True
        )
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
        rows = await self._exec(Q["get"], {"ns": namespace, "key": key, "stale": stale_for})
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
        await self._exec(Q["put"], params)

    async def _delete(self, namespace: str, keys: list[str] | None, *, expired: bool) -> int:
        params = {"ns": namespace, "keys": keys, "expired": expired}
        return int((await self._exec(Q["delete"], params))[0][0])

    async def delete(self, namespace: str, key: str) -> None:
        await self._delete(namespace, [key], expired=False)

    async def clear(self, namespace: str | None = None) -> int:
        if namespace is not None:
            return await self._delete(namespace, None, expired=False)
        rows = await self._exec(Q["namespaces"], {})
        return sum([await self._delete(ns, None, expired=False) for (ns,) in rows])

    async def purge(self, *, batch: int = PURGE_BATCH) -> int:
        """Delete the entries past their expiry and stale window, ``batch`` at a time,
        oldest first; returns how many went."""
        removed = 0
        while True:
            rows = await self._exec(Q["expired"], {"limit": batch})
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
                Q["count"],
                {"ns": namespace, "names": list(amounts), "values": list(amounts.values())},
            )

    async def stats(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for ns, name, value in await self._exec(Q["stats"], {}):
            out.setdefault(ns, {})[name] = int(value)
        return out


def home(settings: Settings, database_url: Callable[[], str]) -> str:
    """HERD_CACHE=postgres (the default): herd's own PostgreSQL."""
    return database_url()
