"""An ingest run as the catalogue sees it: the files it read, staged and compared with
the collection's chunks, then stored, and at its end the chunks it no longer saw
removed. ``RagStore.stage_run`` and ``RagStore.finish_run`` hand these out; the
statements are ``herd/rag/sql/queries.sql``'s ``run_*`` blocks.

A run's deletion scope is the files it read and whatever lies under the folders it
was given; folders compare as plain prefixes (see queries.sql).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from psycopg import AsyncConnection, AsyncCopy, sql

from herd.db.queries import named

Q = named("herd.rag.sql")


def prefixes(folders: Iterable[str | Path]) -> list[str]:
    """What the paths under each folder start with (the root folder is its own prefix)."""
    return [os.path.join(d, "") for d in folders]


class RunStage:
    """A run's chunks in a temporary table of one connection (``herd_run_chunks``:
    chunk id, source, part, text, breadcrumb, metadata, hash and the file's order),
    compared with the collection's before anything of the collection changes."""

    def __init__(
        self, conn: AsyncConnection[Any], collection: str, files: list[str], folders: list[str]
    ) -> None:
        self.conn, self.collection = conn, collection
        self.files, self.folders = files, folders
        self.params: dict[str, Any] = {
            "c": collection,
            "files": files,
            "folders": prefixes(folders),
        }

    @asynccontextmanager
    async def file(self) -> AsyncIterator[AsyncCopy]:
        """A COPY of one file's rows, in a transaction of its own: a file that fails is
        rolled back, and the others stay in the run."""
        async with self.conn.transaction(), self.conn.cursor().copy(Q["copy_run_chunks"]) as copy:
            yield copy

    async def forget(self, sources: Iterable[str]) -> None:
        """Drop these files' rows (read again under another place)."""
        await self.conn.execute(Q["forget_run_sources"], (list(sources),))

    async def clashing_sources(self) -> set[str]:
        """The run's files whose chunk ids an earlier file of the run has, or a file of the
        collection outside the run's scope."""
        cur = await self.conn.execute(Q["run_clashing_sources"], self.params)
        return {r[0] for r in await cur.fetchall()}

    async def shared_id(self) -> tuple[str, list[str]] | None:
        """A chunk id two files of the run still share, with those files."""
        cur = await self.conn.execute(Q["run_shared_id"])
        row = await cur.fetchone()
        return (row[0], list(row[1])) if row else None

    async def taken_id(self) -> tuple[str, str, str] | None:
        """(chunk id, the collection's file, the run's file) of an id the collection has
        from a file outside the run's scope."""
        cur = await self.conn.execute(Q["run_id_taken"], self.params)
        row = await cur.fetchone()
        return (row[0], row[1], row[2]) if row else None

    async def changes(self) -> tuple[int, int, int, int]:
        """(added, changed, unchanged, deleted) chunks, against the collection."""
        cur = await self.conn.execute(Q["run_changes"], self.params)
        counts = await cur.fetchone()
        cur = await self.conn.execute(Q["run_deletions"], self.params)
        deleted = await cur.fetchone()
        assert counts is not None and deleted is not None
        return counts[0], counts[1], counts[2], deleted[0]

    async def store(self, generation: int) -> int:
        """Record the run and store its chunks (new texts, moved sources) in one
        transaction; the run's id, which every chunk it stored carries."""
        async with self.conn.transaction():
            cur = await self.conn.execute(
                Q["add_run"], {**self.params, "g": generation, "dirs": self.folders}
            )
            row = await cur.fetchone()
            assert row is not None
            await self.conn.execute(Q["store_run_chunks"], {**self.params, "run": row[0]})
        return int(row[0])


async def finish(conn: AsyncConnection[Any], run: int, collection: str) -> list[str]:
    """In the caller's transaction: delete the chunks of the run's scope that it did not
    see (and their rows in every generation not retired), mark the run done, and
    return the deleted chunk ids."""
    cur = await conn.execute(Q["run_scope"], (run,))
    row = await cur.fetchone()
    files, folders = row if row else ([], [])
    cur = await conn.execute(
        Q["delete_unseen"],
        {"c": collection, "run": run, "files": files, "folders": prefixes(folders)},
    )
    gone = [r[0] for r in await cur.fetchall()]
    cur = await conn.execute(Q["unretired_generation_ids"], (collection,))
    for (gen_id,) in await cur.fetchall():
        table = sql.Identifier(f"herd_vectors_{gen_id}")
        await conn.execute(sql.SQL(Q["delete_rows"]).format(t=table), (gone,))
    await conn.execute(Q["finish_run"], (run,))
    return gone
