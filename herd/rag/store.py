"""The corpus catalogue in PostgreSQL: source chunks, index generations, queries.

A generation's chunks live in a table of their own, ``herd_vectors_<id>`` (chunk
id, hash, lexemes), and its dense vectors in the vector store it was built in
(``herd.rag.vectors``: pgvector, a column of that same table with an HNSW index
built once the vectors are loaded, by default; Milvus or Qdrant). A row of that
table says the chunk's vector was written at that hash: for a store outside
PostgreSQL the row is written after the vector, in the job's fenced transaction.
Re-indexing with another embedder or chunker builds a new generation beside the
live one; ``swap`` checks it (count and a checksum over the chunk hashes) and
points the collection at it in one UPDATE, so queries move from the old index to
the new one atomically. The old generation is retired, not dropped: a query that
resolved it just before the swap still reads its table. ``drop_retired`` drops
those retired longer than the grace (``HERD_RAG_RETIRED_GRACE``, 300 s by
default), at every finalize, so at most the latest few tables wait for it.

Beside each vector, the table keeps the chunk's ``lexemes`` (a tsvector in the
text-search configuration of the generation's ``language``, GIN-indexed), written
in the same upsert from the same text, so the lexical and the dense rankings of a
generation always cover the same chunks at the same hashes. ``search_lexical``
ranks by BM25 over them (PostgreSQL's ``ts_rank`` has no inverse document
frequency, which is what makes a rare name or number count).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg.vector import register_vector_info
from psycopg import AsyncConnection, sql
from psycopg.rows import dict_row
from psycopg.types import TypeInfo
from psycopg.types.json import Jsonb

from herd.db import postgres as pgdb
from herd.db.queries import named
from herd.rag import variants
from herd.rag import vectors as stores
from herd.rag.errors import IndexError_, generation_gone
from herd.rag.runs import RunStage, finish
from herd.rag.vectors import Row, Space, StoreUrl, VectorStore

Q = named("herd.rag.sql")


def _q(name: str, **parts: sql.Composable) -> sql.Composed:
    """A named statement whose ``{placeholders}`` are identifiers or literals."""
    return sql.SQL(Q[name]).format(**parts)


def translate_errors(url: str) -> AbstractContextManager[None]:
    return pgdb.translate_errors(url, store="the corpus index")


@dataclass(frozen=True)
class Generation:
    id: int
    collection: str
    fingerprint: str
    dim: int
    status: str
    settings: dict[str, Any]

    @property
    def table(self) -> sql.Identifier:
        return sql.Identifier(f"herd_vectors_{self.id}")

    @property
    def language(self) -> str:
        """The text-search configuration of its lexemes (older generations: english)."""
        return str(self.settings.get("language") or "english")

    @property
    def store(self) -> str:
        """The location of the vector store it was built in (older generations: pgvector)."""
        return str(self.settings.get("vectors") or stores.DEFAULT)

    @property
    def space(self) -> Space:
        return Space(self.id, self.collection, self.dim, self.language)


@dataclass(frozen=True)
class Hit:
    chunk_id: str
    breadcrumb: str
    text: str
    score: float  # cosine (dense search), BM25 (lexical) or fused (hybrid, herd.rag.fusion)
    metadata: dict[str, Any]
    matched: float | None = None
    """Lexical search: the share of the query's words (by idf) the chunk holds."""
    found: float | None = None
    """Lexical search: the share of the query's words (by idf) that any chunk holds."""


class RagStore:
    def __init__(
        self, url: str, *, pool_size: int = 4, vector_url: StoreUrl | str | None = None
    ) -> None:
        # Where new generations put their vectors (HERD_VECTOR_URL), checked first.
        self.vector_url = (
            vector_url if isinstance(vector_url, StoreUrl) else stores.parse(vector_url)
        )
        self.url = url
        self.pool = pgdb.SharedPool(
            url, max_size=pool_size, store="the corpus index", adapt=self._adapt
        )
        self._vector_info: TypeInfo | None = None
        self._stores: dict[str, VectorStore] = {}

    async def open(self) -> None:
        await self.pool.open("herd.rag.sql")

    async def _adapt(self, conn: AsyncConnection[Any]) -> None:
        """pgvector's types on each connection checked out (they are client-side only)."""
        if self._vector_info is None:
            self._vector_info = await TypeInfo.fetch(conn, "vector")
        if self._vector_info is not None:  # None until migrated: the extension is made there
            register_vector_info(conn, self._vector_info)

    async def close(self) -> None:
        for store in self._stores.values():
            await store.close()
        self._stores.clear()
        await self.pool.close()

    def vectors(self, location: str | None = None) -> VectorStore:
        """The vector store at ``location`` (default: the configured one), opened once."""
        where = location or self.vector_url.location
        if where not in self._stores:
            self._stores[where] = stores.open_store(stores.resolve(where, self.vector_url), self)
        return self._stores[where]

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        with translate_errors(self.url):
            async with self.pool.connection() as conn:
                yield conn

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection[Any]]:
        async with self.connection() as conn, conn.transaction():
            yield conn

    async def fetch(self, query: Any, params: Any = None) -> list[tuple[Any, ...]]:
        async with self.connection() as conn:
            cur = await conn.execute(query, params)
            return await cur.fetchall() if cur.description else []

    # -- ingest runs: the only writer of herd_chunks and herd_ingest_runs

    @asynccontextmanager
    async def stage_run(
        self, collection: str, files: list[str], folders: list[str]
    ) -> AsyncIterator[RunStage]:
        """A run's staging table on a connection of its own (see ``herd.rag.runs``)."""
        async with self.connection() as conn:
            await conn.execute(Q["create_run_table"])
            await conn.execute(Q["truncate_run_table"])
            yield RunStage(conn, collection, files, folders)
            await conn.execute(Q["drop_run_table"])

    async def finish_run(self, conn: AsyncConnection[Any], run: int, collection: str) -> list[str]:
        """In ``conn``'s (fenced) transaction: remove what the run no longer saw, mark it
        done; the chunk ids removed (their vectors outside PostgreSQL go after the commit,
        with ``delete_vectors``)."""
        return await finish(conn, run, collection)

    async def text_search_configs(self) -> list[str]:
        """The server's text-search configurations (a generation's ``language``)."""
        return sorted(r[0] for r in await self.fetch(Q["text_search_configs"]))

    # -- generations

    async def live(self, collection: str) -> Generation | None:
        rows = await self._generations(Q["live_generation"], (collection,))
        return rows[0] if rows else None

    async def active(self, collection: str) -> list[Generation]:
        """The collection's generations that are live or being built."""
        return await self._generations(Q["active_generations"], (collection,))

    async def generation(self, gen_id: int) -> Generation:
        rows = await self._generations(Q["generation"], (gen_id,))
        if not rows:
            raise IndexError_(f"no index generation {gen_id}")
        return rows[0]

    async def _generations(self, query: str, params: Any) -> list[Generation]:
        async with self.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(query, params)
            return [
                Generation(
                    r["id"], r["collection"], r["fingerprint"], r["dim"], r["status"], r["settings"]
                )
                for r in await cur.fetchall()
            ]

    async def target(
        self, collection: str, fingerprint: str, settings: dict[str, Any], dim: int
    ) -> tuple[Generation, bool]:
        """The generation a run writes to, and whether it is a new one being built.

        Same fingerprint as the live generation: update it in place. Otherwise a
        generation is built beside it (or resumed, if a run was interrupted).
        """
        live = await self.live(collection)
        if live is not None and live.fingerprint == fingerprint:
            return live, False
        rows = await self._generations(Q["building_generation"], (collection, fingerprint))
        if rows:
            return rows[0], True
        async with self.connection() as conn, conn.transaction():
            await conn.execute(Q["add_collection"], (collection,))
            cur = await conn.execute(
                Q["add_generation"], (collection, fingerprint, Jsonb(settings), dim)
            )
            row = await cur.fetchone()
            assert row is not None
            gen = Generation(row[0], collection, fingerprint, dim, "building", settings)
            await conn.execute(_q("create_generation_table", t=gen.table))
            index = sql.Identifier(f"herd_vectors_{gen.id}_lexemes")
            await conn.execute(_q("index_lexemes", index=index, t=gen.table))
            # The store's space last: a failure there rolls the catalogue back.
            await self.vectors(gen.store).create(conn, gen.space)
        return gen, True

    async def build_index(self, gen: Generation) -> None:
        """Index a loaded generation in its store (pgvector: the HNSW graph), before the swap."""
        await self.vectors(gen.store).prepare(gen.space)

    # -- vectors

    async def upsert_vectors(
        self,
        conn: AsyncConnection[Any],
        gen: Generation,
        rows: Sequence[tuple[str, str, np.ndarray, str]],
        token: int = 0,
    ) -> None:
        """(chunk_id, hash, vector, text) rows, within the caller's (fenced) transaction.

        ``token``: the fencing token of the writer (the partition lock's), which a
        store outside PostgreSQL keeps with each vector to refuse older writers.
        """
        if not rows:
            return
        store = self.vectors(gen.store)
        await store.upsert(conn, gen.space, [Row(*r) for r in rows], token)
        if store.joins_transaction:
            return
        await conn.execute(
            _q("upsert_lexemes", t=gen.table, language=sql.Literal(gen.language)),
            ([r[0] for r in rows], [r[1] for r in rows], [r[3] for r in rows]),
        )

    async def vector_type(self) -> TypeInfo:
        return await self._vector_type()

    async def _vector_type(self) -> TypeInfo:
        if self._vector_info is None:
            async with self.connection() as conn:
                info = await TypeInfo.fetch(conn, "vector")
            if info is None:
                raise IndexError_("the vector type is missing: is pgvector installed?")
            self._vector_info = info
        return self._vector_info

    async def missing(self, gen: Generation) -> list[tuple[str, str, str]]:
        """(chunk_id, hash, part) of the collection's chunks not embedded at their hash."""
        return [
            (a, b, c) for a, b, c in await self.fetch(_q("missing", t=gen.table), (gen.collection,))
        ]

    async def count_missing(self, gen: Generation) -> int:
        rows = await self.fetch(_q("count_missing", t=gen.table), (gen.collection,))
        return int(rows[0][0])

    async def to_embed(
        self, gen: Generation, items: Sequence[tuple[str, str]]
    ) -> list[tuple[str, str, str]]:
        """(chunk_id, hash, text) of the items whose hash is still current and that have no
        vector at that hash yet (a retry after the upsert was acknowledged has none)."""
        return [
            (a, b, c)
            for a, b, c in await self.fetch(
                _q("to_embed", t=gen.table),
                ([i[0] for i in items], [i[1] for i in items], gen.collection),
            )
        ]

    async def embedded(self, gen: Generation, items: Sequence[tuple[str, str]]) -> set[str]:
        """The items' chunk ids that already have a vector at that hash (acknowledged)."""
        rows = await self.fetch(
            _q("embedded", t=gen.table), ([i[0] for i in items], [i[1] for i in items])
        )
        return {r[0] for r in rows}

    async def swap(
        self,
        gen: Generation,
        transaction: Callable[[], AbstractAsyncContextManager[AsyncConnection[Any]]] | None = None,
    ) -> None:
        """Make ``gen`` live after checking it covers every chunk at its current hash and
        is still being built (a generation retired, or swapped in by another run, is never
        made live again). ``transaction``: the caller's (a job's, fenced by its lease)."""
        store = self.vectors(gen.store)
        if not store.joins_transaction:
            await self._check_store(store, gen)
        async with (transaction or self.transaction)() as conn:
            await conn.execute(Q["lock_collection"], (gen.collection,))
            cur = await conn.execute(_q("swap_check", t=gen.table), {"c": gen.collection})
            row = await cur.fetchone()
            assert row is not None
            chunks, vectors, sum_chunks, sum_vectors = row
            if chunks != vectors or sum_chunks != sum_vectors:
                raise IndexError_(
                    f"generation {gen.id} of {gen.collection!r} does not match its chunks"
                    f" ({vectors} vectors for {chunks} chunks); not swapping"
                )
            cur = await conn.execute(Q["make_live"], (gen.id,))
            if cur.rowcount != 1:
                raise IndexError_(
                    f"generation {gen.id} of {gen.collection!r} is no longer being built;"
                    " not swapping"
                )
            await conn.execute(Q["retire_others"], (gen.collection, gen.id))
            await conn.execute(Q["point_collection"], (gen.id, gen.collection))
        # After the commit: other readers of the alias move when herd's queries do.
        await self.vectors(gen.store).publish(gen.space)

    async def _check_store(self, store: VectorStore, gen: Generation) -> None:
        """The store holds a vector at every catalogue row's hash. A row whose vector is
        not there (a store that lost writes it had acknowledged, or changed behind herd's
        back) is deleted, so the chunk counts as missing and the next run embeds it
        again; what else the store holds (a chunk deleted after a crash between the
        catalogue's commit and the store's delete) is removed."""
        rows = await self.fetch(_q("rows_of", t=gen.table))
        expected = {a: b for a, b in rows}
        held = await store.inventory(gen.space)
        wrong = [c for c, h in expected.items() if held.get(c) != h]
        if wrong:
            async with self.connection() as conn:
                await conn.execute(_q("delete_rows", t=gen.table), (wrong,))
            raise IndexError_(
                f"generation {gen.id} of {gen.collection!r}: the vector store {gen.store} lacks"
                f" {len(wrong)} of its {len(expected)} vectors at their hash (first:"
                f" {wrong[0]!r}); not swapping: re-run herd ingest to embed them again"
            )
        await store.delete(gen.space, [c for c in held if c not in expected])

    async def drop_retired(self, grace: float) -> list[int]:
        """Drop the vector tables of generations retired ``grace`` seconds ago or more.

        Every collection's: whichever ingest finalizes next keeps the state bounded.
        A query still reading a table holds the DROP back until it is done.
        """
        dropped = []
        for gen in await self._generations(Q["retired_to_drop"], (grace,)):
            gen_id = gen.id
            # The store's space first: a crash after it leaves the catalogue to retry.
            await self.vectors(gen.store).drop(gen.space)
            async with self.connection() as conn, conn.transaction():
                await conn.execute(_q("drop_generation_table", t=gen.table))
                await conn.execute(Q["mark_dropped"], (gen_id,))
            dropped.append(gen_id)
        return dropped

    # -- queries

    async def search(
        self, gen: Generation, vector: np.ndarray, k: int, *, ef_search: int = 64
    ) -> list[Hit]:
        """The k chunks nearest ``vector`` by cosine, from the generation's store."""
        found = await self.vectors(gen.store).search(gen.space, vector, k, ef_search)
        if not found:
            return []
        rows = await self.fetch(Q["chunks_by_id"], ([c for c, _ in found], gen.collection))
        chunks = {a: (b, t, m) for a, b, t, m in rows}
        # A vector whose chunk was deleted since (see _check_store) is no answer.
        return [Hit(c, *chunks[c][:2], score, chunks[c][2]) for c, score in found if c in chunks]

    async def delete_vectors(self, gen: Generation, chunk_ids: Sequence[str]) -> None:
        """Remove chunks' vectors from a store outside the catalogue (after its commit)."""
        await self.vectors(gen.store).delete(gen.space, chunk_ids)

    async def search_lexical(self, gen: Generation, text: str, k: int) -> list[Hit]:
        """The k chunks that best match the words of ``text``, by BM25 (k1 1.2, b 0.75).

        Words go through the generation's text-search configuration (stemming,
        stopwords) and its language's variants (``herd.rag.variants``: spellings,
        archaic forms), any of them may match (OR), and each counts by its inverse
        document frequency. The score is BM25's, not a cosine; ``matched`` the share
        of the query each chunk holds.
        """
        query = _q("bm25", t=gen.table)
        lexical = variants.lexical_query(gen.language, text)
        params = {
            "cfg": gen.language,
            "q": lexical.text,
            "words": lexical.words,
            "forms": lexical.forms,
            "k": k,
            "c": gen.collection,
        }
        async with self.connection() as conn:
            try:
                cur = await conn.execute(query, params)
            except psycopg.errors.UndefinedTable:
                raise generation_gone(gen.id, gen.collection) from None
            except psycopg.errors.UndefinedColumn:
                raise IndexError_(
                    f"generation {gen.id} of {gen.collection!r} predates lexical search:"
                    " re-run herd ingest with --new-generation to build one that has it"
                ) from None
            rows = await cur.fetchall()
            return [Hit(a, b, t, float(s), m, float(f), float(q)) for a, b, t, s, m, f, q in rows]

    async def units(self, collection: str, patterns: Sequence[str]) -> list[Hit]:
        """Chunks whose ids match any of the SQL LIKE ``patterns`` (exact-reference lookup),
        in the order of the patterns, then by id; score 1.0."""
        if not patterns:
            return []
        rows = await self.fetch(Q["units"], (list(patterns), collection))
        seen: dict[str, Hit] = {}
        for a, b, t, m in rows:
            seen.setdefault(a, Hit(a, b, t, 1.0, m))
        return list(seen.values())
