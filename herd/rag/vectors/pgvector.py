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

from herd.db.queries import named
from herd.rag.errors import generation_gone
from herd.rag.vectors.base import Catalogue, Row, Space, StoreUrl

Q = named("herd.rag.sql")


def _table(space: Space) -> sql.Identifier:
    return sql.Identifier(f"herd_vectors_{space.id}")


def _q(name: str, space: Space, **parts: sql.Composable) -> sql.Composed:
    return sql.SQL(Q[f"pgvector_{name}"]).format(t=_table(space), **parts)


class PgVectors:
    joins_transaction = True

    def __init__(self, url: StoreUrl, catalogue: Catalogue) -> None:
        self.url, self.catalogue = url, catalogue

    async def create(self, conn: Any, space: Space) -> None:
        await conn.execute(_q("add_column", space, dim=sql.Literal(space.dim)))

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
            _q("upsert", space, language=sql.Literal(space.language)),
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
            await conn.execute(_q("lock_for_index", space))
            cur = await conn.execute(Q["pgvector_has_index"], (f"herd_vectors_{space.id}",))
            if await cur.fetchone():
                return
            await conn.execute(Q["pgvector_index_memory"])
            index = sql.Identifier(f"herd_vectors_{space.id}_hnsw")
            await conn.execute(_q("index", space, index=index))

    async def inventory(self, space: Space) -> dict[str, str]:
        rows = await self.catalogue.fetch(sql.SQL(Q["rows_of"]).format(t=_table(space)))
        return {a: b for a, b in rows}

    async def search(
        self, space: Space, vector: np.ndarray, k: int, ef: int
    ) -> list[tuple[str, float]]:
        async with self.catalogue.connection() as conn, conn.transaction():
            await conn.execute(_q("ef_search", space, ef=sql.Literal(max(ef, k))))
            try:
                cur = await conn.execute(
                    _q("search", space), {"q": np.asarray(vector, dtype=np.float32), "k": k}
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
