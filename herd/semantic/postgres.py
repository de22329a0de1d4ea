"""The semantic cache on pgvector (the default): one table, an HNSW index per dimension.

Scope and expiry are WHERE clauses of the KNN query itself. With filters, a
plain HNSW scan returns ``ef_search`` rows and filters them afterwards, which
can leave fewer than k (or none) when the scope is small; pgvector 0.8's
``hnsw.iterative_scan`` keeps scanning until enough rows pass, so every search
sets it, for its own transaction (a session SET would not survive PgBouncer).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, cast

from pgvector.psycopg.vector import register_vector_info
from psycopg import AsyncConnection, sql
from psycopg.types import TypeInfo
from psycopg.types.json import Jsonb

from herd.db import postgres as pgdb
from herd.jsonvalue import dumps
from herd.locks.base import BaseLocks
from herd.semantic.base import Candidate, NewEntry, Scope, Vector, as_vector

_INDEX_LOCK = 0x68657264_5345  # 'herdSE': one index builder at a time

_SEARCH = """
SELECT id, query, guard, value, vec, delta, created_at, expires_at,
       1 - (vec::vector({dim}) <=> %(v)s::vector({dim})), verdicts
  FROM herd_semantic
 WHERE cache = %(cache)s AND dim = {dim} AND tenant = %(tenant)s AND embedder = %(embedder)s
   AND collection = %(collection)s AND generation = %(generation)s
   AND expires_at > %(alive)s
 ORDER BY vec::vector({dim}) <=> %(v)s::vector({dim})
 LIMIT %(k)s
"""

_UPSERT = """
INSERT INTO herd_semantic (cache, id, tenant, embedder, collection, generation, scope, dim,
                           query, guard, value, vec, delta, created_at, expires_at, keep_until,
                           last_used)
VALUES (%(cache)s, %(id)s, %(tenant)s, %(embedder)s, %(collection)s, %(generation)s, %(scope)s,
        %(dim)s, %(query)s, %(guard)s, %(value)s, %(v)s, %(delta)s, %(created)s, %(expires)s,
        %(keep)s, %(now)s)
ON CONFLICT (cache, id) DO UPDATE
   SET query = excluded.query, guard = excluded.guard, value = excluded.value,
       vec = excluded.vec, delta = excluded.delta, created_at = excluded.created_at,
       expires_at = excluded.expires_at, keep_until = excluded.keep_until,
       last_used = excluded.last_used, verdicts = '[]'
RETURNING xmax = 0
"""

_GROW = """
INSERT INTO herd_semantic_sizes (cache, n) VALUES (%(cache)s, 1)
ON CONFLICT (cache) DO UPDATE SET n = herd_semantic_sizes.n + 1
RETURNING n
"""

# Past the bound: first what outlived its stale window, then the least recently used.
_EVICT = """
WITH gone AS (
  DELETE FROM herd_semantic WHERE cache = %(cache)s AND keep_until < %(now)s RETURNING 1
), oldest AS (
  DELETE FROM herd_semantic WHERE (cache, id) IN (
    SELECT cache, id FROM herd_semantic WHERE cache = %(cache)s AND id <> %(keep)s
       AND keep_until >= %(now)s
     ORDER BY last_used LIMIT %(over)s FOR UPDATE SKIP LOCKED)
  RETURNING 1
)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM oldest)
"""

_TOUCH = """
UPDATE herd_semantic s
   SET last_used = greatest(s.last_used, u.at),
       expires_at = coalesce(u.expires, s.expires_at),
       keep_until = coalesce(u.keep, s.keep_until)
  FROM unnest(%(ids)s::text[], %(at)s::float8[], %(expires)s::float8[], %(keep)s::float8[])
       AS u(id, at, expires, keep)
 WHERE s.cache = %(cache)s AND s.id = u.id
"""

# The newest ``keep`` verdicts, oldest first.
_JUDGE = """
UPDATE herd_semantic
   SET verdicts = (SELECT coalesce(jsonb_agg(v ORDER BY o), '[]'::jsonb)
                     FROM (SELECT v, o FROM jsonb_array_elements(verdicts || %(new)s)
                                  WITH ORDINALITY AS t(v, o)
                            ORDER BY o DESC LIMIT %(keep)s) AS newest)
 WHERE cache = %(cache)s AND id = %(id)s
"""

_COUNT = """
INSERT INTO herd_semantic_stats (cache, name, value)
SELECT %(cache)s, n, v FROM unnest(%(names)s::text[], %(values)s::bigint[]) AS c(n, v)
ON CONFLICT (cache, name) DO UPDATE SET value = herd_semantic_stats.value + excluded.value
"""


# relaxed_order: the cache re-scores the candidates itself, so strict order is not needed.
_SEARCH_SETTINGS = (
    "SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true),"
    " set_config('hnsw.ef_search', '64', true)"
)


def translate_errors(url: str) -> AbstractContextManager[None]:
    return pgdb.translate_errors(url, store="the semantic cache")


class PostgresSemanticStore:
    name = "postgres"

    def __init__(self, url: str, *, pool_size: int = 4) -> None:
        self.url = url
        self.dim = 0
        self._pool = pgdb.SharedPool(
            url, max_size=pool_size, store="the semantic cache", adapt=self._adapt
        )
        self._vector_info: TypeInfo | None = None
        self._search: sql.Composable = sql.SQL("")

    def locks(self) -> BaseLocks:
        from herd.locks.postgres import PostgresLocks

        return PostgresLocks(self.url)

    async def open(self, dim: int | None) -> None:
        self.dim = dim or 0
        self._search = sql.SQL(_SEARCH).format(dim=sql.Literal(self.dim))
        await self._pool.open("herd.semantic.sql")
        with translate_errors(self.url):
            async with self._pool.connection() as conn:
                if dim is not None:  # None: bookkeeping only (stats, clear)
                    async with conn.transaction():
                        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_INDEX_LOCK,))
                        await conn.execute(
                            sql.SQL(
                                "CREATE INDEX IF NOT EXISTS {name} ON herd_semantic USING hnsw"
                                " ((vec::vector({dim})) vector_cosine_ops) WHERE dim = {dim}"
                            ).format(
                                name=sql.Identifier(f"herd_semantic_hnsw_{dim}"),
                                dim=sql.Literal(dim),
                            )
                        )

    async def _adapt(self, conn: AsyncConnection[Any]) -> None:
        """pgvector's types on each connection checked out (they are client-side only)."""
        if self._vector_info is None:
            self._vector_info = await TypeInfo.fetch(conn, "vector")
        if self._vector_info is not None:  # None until migrated: the extension is made there
            register_vector_info(conn, self._vector_info)

    async def close(self) -> None:
        await self._pool.close()

    async def _exec(self, query: Any, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with translate_errors(self.url):
            async with self._pool.connection() as conn:
                cur = await conn.execute(query, params)
                return await cur.fetchall() if cur.description else []

    async def server_time(self) -> float:
        rows = await self._exec("SELECT extract(epoch FROM clock_timestamp())::float8", {})
        return float(rows[0][0])

    async def search(
        self, cache: str, scope: Scope, vector: Vector, *, k: int, alive_at: float, floor: float
    ) -> tuple[float | None, list[Candidate]]:
        params = {"cache": cache, **scope.tags(), "alive": alive_at, "v": vector, "k": k}
        with translate_errors(self.url):
            async with self._pool.connection() as conn, conn.transaction():
                await conn.execute(_SEARCH_SETTINGS)
                cur = await conn.execute(cast(sql.Composed, self._search), params)
                rows = await cur.fetchall()
        nearest = max((float(r[8]) for r in rows), default=None)
        return nearest, [
            Candidate(
                id=r[0],
                query=r[1],
                guard=r[2],
                value=r[3],
                vector=as_vector(r[4].to_numpy() if hasattr(r[4], "to_numpy") else r[4]),
                delta=float(r[5]),
                created_at=float(r[6]),
                expires_at=float(r[7]),
                verdicts=[(float(sim), bool(ok)) for sim, ok in r[9]],
            )
            for r in rows
            if float(r[8]) >= floor
        ]

    async def put(self, cache: str, entry: NewEntry, *, max_entries: int, now: float) -> int:
        dumps(entry.value, what="semantic cache value")
        scope = entry.scope
        params = {
            "cache": cache,
            "id": entry.id,
            **scope.tags(),
            "scope": Jsonb(
                {
                    "tenant": scope.tenant,
                    "embedder": scope.embedder,
                    "collection": scope.collection,
                    "generation": scope.generation,
                }
            ),
            "dim": self.dim,
            "query": entry.query,
            "guard": Jsonb(entry.guard),
            "value": Jsonb(entry.value),
            "v": entry.vector,
            "delta": entry.delta,
            "created": entry.created_at,
            "expires": entry.expires_at,
            "keep": entry.expires_at + entry.keep_stale,
            "now": now,
        }
        with translate_errors(self.url):
            async with self._pool.connection() as conn:
                async with conn.transaction():
                    cur = await conn.execute(_UPSERT, params)
                    row = await cur.fetchone()
                    if not (row and row[0]):
                        return 0  # replaced an entry: the count did not change
                    cur = await conn.execute(_GROW, {"cache": cache})
                    size = await cur.fetchone()
                n = int(size[0]) if size else 0
                if n <= max_entries:
                    return 0
                async with conn.transaction():
                    cur = await conn.execute(
                        _EVICT,
                        {"cache": cache, "now": now, "keep": entry.id, "over": n - max_entries},
                    )
                    counts = await cur.fetchone()
                    expired, evicted = (int(counts[0]), int(counts[1])) if counts else (0, 0)
                    await conn.execute(
                        "UPDATE herd_semantic_sizes SET n = n - %(d)s WHERE cache = %(cache)s",
                        {"d": expired + evicted, "cache": cache},
                    )
                return evicted

    async def touch(
        self,
        cache: str,
        used: dict[str, float],
        expires: dict[str, tuple[float, float]] | None = None,
        *,
        now: float = 0.0,
    ) -> None:
        if not used:
            return
        ids = list(used)
        moved = expires or {}
        await self._exec(
            _TOUCH,
            {
                "cache": cache,
                "ids": ids,
                "at": [used[i] for i in ids],
                "expires": [moved[i][0] if i in moved else None for i in ids],
                "keep": [moved[i][0] + moved[i][1] if i in moved else None for i in ids],
            },
        )

    async def judge(
        self, cache: str, entry_id: str, similarity: float, correct: bool, *, keep: int
    ) -> None:
        new = Jsonb([[similarity, 1 if correct else 0]])
        await self._exec(_JUDGE, {"cache": cache, "id": entry_id, "new": new, "keep": keep})

    async def clear(self, cache: str | None = None, collection: str | None = None) -> int:
        with translate_errors(self.url):
            async with self._pool.connection() as conn, conn.transaction():
                cur = await conn.execute(
                    "WITH d AS (DELETE FROM herd_semantic WHERE (%(c)s::text IS NULL OR cache ="
                    " %(c)s) AND (%(col)s::text IS NULL OR scope->>'collection' = %(col)s)"
                    " RETURNING 1) SELECT count(*) FROM d",
                    {"c": cache, "col": collection},
                )
                row = await cur.fetchone()
                await conn.execute(
                    "UPDATE herd_semantic_sizes z SET n = (SELECT count(*) FROM herd_semantic s"
                    " WHERE s.cache = z.cache) WHERE %(c)s::text IS NULL OR z.cache = %(c)s",
                    {"c": cache},
                )
        return int(row[0]) if row else 0

    async def add_stats(self, cache: str, amounts: dict[str, int]) -> None:
        amounts = {k: v for k, v in amounts.items() if v}
        if amounts:
            await self._exec(
                _COUNT, {"cache": cache, "names": list(amounts), "values": list(amounts.values())}
            )

    async def read_stats(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for cache, name, value in await self._exec(
            "SELECT cache, name, value FROM herd_semantic_stats", {}
        ):
            out.setdefault(cache, {})[name] = int(value)
        # herd_semantic_sizes is kept by every write and purge (the size bound reads
        # it too): O(caches) rows instead of counting the table on each poll.
        for cache, n in await self._exec("SELECT cache, n FROM herd_semantic_sizes", {}):
            out.setdefault(cache, {})["entries"] = int(n)
        return out
