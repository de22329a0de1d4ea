"""pgvector: the vectors in a column of the generation's catalogue table, in herd's database.

The upsert is one statement in the caller's transaction, the job's fenced one,
so a stale writer's vectors never commit and no token needs storing. The HNSW
index is built once the vectors are loaded (``prepare``): building the graph
once costs a fraction of maintaining it through tens of thousands of inserts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import psycopg
from pgvector.psycopg.vector import register_vector_info
from psycopg import sql

from herd.rag.errors import generation_gone
from herd.rag.vectors.base import Catalogue, Row, Space, StoreUrl


def _table(space: Space) -> sql.Identifier:
    return sql.Identifier(f"herd_vectors_{space.id}")


class PgVectors:
    joins_transaction = True

    def __init__(self, url: StoreUrl, catalogue: Catalogue) -> None:
        self.url, self.catalogue = url, catalogue

    async def create(self, conn: Any, space: Space) -> None:
        await conn.execute(
            sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS embedding vector({}) NOT NULL").format(
                _table(space), sql.Literal(space.dim)
            )
        )

    async def upsert(self, conn: Any, space: Space, rows: Sequence[Row], token: int) -> int:
        if not rows:
            return 0
        # The caller's connection (the broker's, for a fenced transaction) does not
        # know pgvector's type: teach this cursor alone, with the type looked up
        # once, so vectors travel in binary (formatting and parsing them as text
        # costs the CPU the embedder needs).
        cur = conn.cursor()
        register_vector_info(cast(Any, cur), await self.catalogue.vector_type())
        await cur.execute(
            sql.SQL(
                "INSERT INTO {} (chunk_id, hash, embedding, lexemes) SELECT i, h, e,"
                " to_tsvector({}::regconfig, t) FROM unnest(%s::text[], %s::text[],"
                " %b::vector[], %s::text[]) AS r(i, h, e, t) ON CONFLICT (chunk_id) DO UPDATE"
                " SET hash = excluded.hash, embedding = excluded.embedding,"
                " lexemes = excluded.lexemes"
            ).format(_table(space), sql.Literal(space.language)),
            (
                [r.chunk_id for r in rows],
                [r.hash for r in rows],
                [np.asarray(r.vector, dtype=np.float32) for r in rows],
                [r.text for r in rows],
            ),
        )
        return len(rows)

    async def prepare(self, space: Space) -> None:
        async with self.catalogue.connection() as conn, conn.transaction():
            # Self-conflicting lock: two finalizers never build the same index twice.
            await conn.execute(
                sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(_table(space))
            )
            cur = await conn.execute(
                "SELECT 1 FROM pg_indexes WHERE schemaname = current_schema()"
                " AND tablename = %s AND indexdef LIKE '%%USING hnsw%%'",
                (f"herd_vectors_{space.id}",),
            )
            if await cur.fetchone():
                return
            # The graph of a large corpus outgrows the default 64 MB and the build
            # then slows down by an order of magnitude.
            await conn.execute("SET LOCAL maintenance_work_mem = '512MB'")
            await conn.execute(
                sql.SQL("CREATE INDEX {} ON {} USING hnsw (embedding vector_cosine_ops)").format(
                    sql.Identifier(f"herd_vectors_{space.id}_hnsw"), _table(space)
                )
            )

    async def inventory(self, space: Space) -> dict[str, str]:
        rows = await self.catalogue.fetch(
            sql.SQL("SELECT chunk_id, hash FROM {}").format(_table(space))
        )
        return {a: b for a, b in rows}

    async def search(
        self, space: Space, vector: np.ndarray, k: int, ef: int
    ) -> list[tuple[str, float]]:
        async with self.catalogue.connection() as conn, conn.transaction():
            await conn.execute(
                sql.SQL("SET LOCAL hnsw.ef_search = {}").format(sql.Literal(max(ef, k)))
            )
            try:
                cur = await conn.execute(
                    sql.SQL(
                        "SELECT chunk_id, 1 - (embedding <=> %(q)s) FROM {}"
                        " ORDER BY embedding <=> %(q)s LIMIT %(k)s"
                    ).format(_table(space)),
                    {"q": np.asarray(vector, dtype=np.float32), "k": k},
                )
            except psycopg.errors.UndefinedTable:
                raise generation_gone(space.id, space.collection) from None
            return [(a, float(s)) for a, s in await cur.fetchall()]

    async def delete(self, space: Space, chunk_ids: Sequence[str]) -> None:
        pass  # the vectors are the catalogue rows, which the caller deletes

    async def publish(self, space: Space) -> None:
        pass  # herd_collections.live_generation is the alias, set by the swap

    async def drop(self, space: Space) -> None:
        pass  # dropping the catalogue table drops the vectors with it

    async def close(self) -> None:
        pass  # the catalogue's pool is the catalogue's to close


def open_store(url: StoreUrl, catalogue: Catalogue) -> PgVectors:
    return PgVectors(url, catalogue)
