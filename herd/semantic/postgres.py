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
from herd.db.queries import named
from herd.jsonvalue import dumps
from herd.locks.base import BaseLocks
from herd.locks.postgres import PostgresLocks
from herd.semantic.base import Candidate, NewEntry, Scope, Vector, as_vector

_INDEX_LOCK = 0x68657264_5345  # 'herdSE': one index builder at a time
Q = named("herd.semantic.sql")


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
        return PostgresLocks(self.url)

    async def open(self, dim: int | None) -> None:
        self.dim = dim or 0
        self._search = sql.SQL(Q["search"]).format(dim=sql.Literal(self.dim))
        await self._pool.open("herd.semantic.sql")
        with translate_errors(self.url):
            async with self._pool.connection() as conn:
                if dim is not None:  # None: bookkeeping only (stats, clear)
                    async with conn.transaction():
                        await conn.execute(Q["index_lock"], (_INDEX_LOCK,))
                        await conn.execute(
                            sql.SQL(Q["create_index"]).format(
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

    def quantize(self, vector: Vector) -> Vector:
        return vector  # pgvector's vector is float32

    async def server_time(self) -> float:
        rows = await self._exec(Q["server_time"], {})
        return float(rows[0][0])

    async def search(
        self, cache: str, scope: Scope, vector: Vector, *, k: int, alive_at: float, floor: float
    ) -> tuple[float | None, list[Candidate]]:
        params = {"cache": cache, **scope.tags(), "alive": alive_at, "v": vector, "k": k}
        with translate_errors(self.url):
            async with self._pool.connection() as conn, conn.transaction():
                await conn.execute(Q["search_settings"])
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
                    cur = await conn.execute(Q["upsert"], params)
                    row = await cur.fetchone()
                    if not (row and row[0]):
                        return 0  # replaced an entry: the count did not change
                    cur = await conn.execute(Q["grow"], {"cache": cache})
                    size = await cur.fetchone()
                n = int(size[0]) if size else 0
                if n <= max_entries:
                    return 0
                async with conn.transaction():
                    cur = await conn.execute(
                        Q["evict"],
                        {"cache": cache, "now": now, "keep": entry.id, "over": n - max_entries},
                    )
                    counts = await cur.fetchone()
                    expired, evicted = (int(counts[0]), int(counts[1])) if counts else (0, 0)
                    await conn.execute(Q["shrink"], {"d": expired + evicted, "cache": cache})
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
            Q["touch"],
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
        await self._exec(Q["judge"], {"cache": cache, "id": entry_id, "new": new, "keep": keep})

    async def clear(self, cache: str | None = None, collection: str | None = None) -> int:
        with translate_errors(self.url):
            async with self._pool.connection() as conn, conn.transaction():
                cur = await conn.execute(Q["clear"], {"c": cache, "col": collection})
                row = await cur.fetchone()
                await conn.execute(Q["recount"], {"c": cache})
        return int(row[0]) if row else 0

    async def add_stats(self, cache: str, amounts: dict[str, int]) -> None:
        amounts = {k: v for k, v in amounts.items() if v}
        if amounts:
            await self._exec(
                Q["count"],
                {"cache": cache, "names": list(amounts), "values": list(amounts.values())},
            )

    async def read_stats(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        # A read: safe to send again, so not checked on a connection fresh from a statement.
        for cache, name, value in await pgdb.sent_again_if_dropped(
            lambda: self._exec(Q["read_stats"], {})
        ):
            out.setdefault(cache, {})[name] = int(value)
        return out
