"""The vector store's contract, run on every store (tests/contract/backends.py:
pgvector in the suite's PostgreSQL, Milvus Lite, a Milvus server, qdrant-client's local
mode and qdrant-edge, each real).

Each store is driven through herd's catalogue (``RagStore``), as ingest and queries
drive it.
"""

from __future__ import annotations

import asyncio
import sys
import uuid

import numpy as np
import pytest
from psycopg.types.json import Jsonb

from herd.rag.errors import GenerationGone, IndexError_
from herd.rag.store import RagStore
from herd.rag.vectors.engine import alias

DIM = 8


@pytest.fixture
def store(vector_store):
    """The vector store under test, through herd's catalogue (backends.py's ``vector_store``)."""
    return vector_store


def unit(i: int) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[i % DIM] = 1.0
    return v


async def new_generation(store: RagStore, name: str, chunks: dict[str, str], tag: str):
    """A collection's chunks (id -> hash) and a generation being built for them."""
    async with store.connection() as conn, conn.transaction():
        for chunk_id, chunk_hash in chunks.items():
            await conn.execute(
                "INSERT INTO herd_chunks (collection, chunk_id, source, part, text, breadcrumb,"
                " metadata, hash, run_id) VALUES (%s, %s, 'f', 'p', %s, %s, %s, %s, 0)"
                " ON CONFLICT (collection, chunk_id) DO UPDATE SET hash = excluded.hash",
                (name, chunk_id, f"text of {chunk_id}", chunk_id, Jsonb({}), chunk_hash),
            )
    settings = {"language": "english", "vectors": store.vector_url.location}
    gen, built = await store.target(name, f"fp-{tag}", settings, DIM)
    assert built
    return gen


async def live_generation(store: RagStore, name: str, tag: str):
    """A generation of chunks a (at unit 0) and b (at unit 1), indexed and swapped in."""
    gen = await new_generation(store, name, {"a": "h", "b": "h"}, tag)
    await write(store, gen, [("a", "h", unit(0), "a"), ("b", "h", unit(1), "b")], 1)
    await store.build_index(gen)
    await store.swap(gen)
    return gen


async def write(store: RagStore, gen, rows, token: int) -> None:
    async with store.connection() as conn, conn.transaction():
        await store.upsert_vectors(conn, gen, rows, token)


async def test_upsert_then_search_ranks_by_cosine_and_reports_what_is_embedded(store, capfd):
    name = f"c{uuid.uuid4().hex[:8]}"
    gen = await new_generation(store, name, {"a": "h1", "b": "h1", "c": "h1"}, "1")
    assert await store.count_missing(gen) == 3
    await write(store, gen, [("a", "h1", unit(0), "alpha"), ("b", "h1", unit(1), "beta")], 1)
    near = unit(1) + 0.2 * unit(0)
    hits = await store.search(gen, near, 2)
    assert [h.chunk_id for h in hits] == ["b", "a"]
    assert hits[0].score > hits[1].score and hits[0].text == "text of b"
    assert await store.embedded(gen, [("a", "h1"), ("b", "h0"), ("c", "h1")]) == {"a"}
    assert [m[0] for m in await store.missing(gen)] == ["c"]
    inventory = await store.vectors(gen.store).inventory(gen.space)
    assert inventory == {"a": "h1", "b": "h1"}
    # No store's client warns of what is right for it (Milvus Lite's missing session
    # timestamp, on every scan): herd ingest's user could do nothing about it. A server
    # that lacks what its client asks for may say so (VectorBackend.known_warning).
    known = store.backend.known_warning
    warned = [w for w in "".join(capfd.readouterr()).splitlines() if "WARNING" in w]
    assert not [w for w in warned if not known or known not in w], warned


READER = """
import asyncio, sys
import numpy as np
from herd.rag.store import RagStore

async def main(pg, url, name, dim):
    store = RagStore(pg, vector_url=url)
    await store.open()
    live = await store.live(name)
    query = np.zeros(int(dim), dtype=np.float32)
    query[1] = 1.0
    print(" ".join(h.chunk_id for h in await store.search(live, query, 2)))
    await store.close()

asyncio.run(main(*sys.argv[1:]))
"""


async def test_another_process_answers_from_what_was_written(store, pg_url):
    name = f"c{uuid.uuid4().hex[:8]}"
    await live_generation(store, name, "1")
    await store.close()  # an embedded engine is one process's at a time
    url = store.vector_url.location
    reader = await asyncio.create_subprocess_exec(
        sys.executable, "-c", READER, pg_url, url, name, str(DIM),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(reader.communicate(), 60)
    assert reader.returncode == 0, err.decode()[-2000:]
    assert out.decode().split() == ["b", "a"]


async def test_a_write_with_an_older_token_leaves_the_newer_vector(store):
    if store.vectors().joins_transaction:
        pytest.skip("pgvector's writes are fenced by the job's transaction, not by a token")
    name = f"c{uuid.uuid4().hex[:8]}"
    gen = await new_generation(store, name, {"a": "new"}, "1")
    await write(store, gen, [("a", "new", unit(0), "a")], 7)
    await write(store, gen, [("a", "old", unit(3), "a")], 5)  # a stale lock holder's
    assert await store.vectors(gen.store).inventory(gen.space) == {"a": "new"}
    assert [h.chunk_id for h in await store.search(gen, unit(0), 1)] == ["a"]
    assert (await store.search(gen, unit(0), 1))[0].score == pytest.approx(1.0, abs=1e-4)
    await write(store, gen, [("a", "newer", unit(2), "a")], 8)  # the next holder's
    assert await store.vectors(gen.store).inventory(gen.space) == {"a": "newer"}
    assert (await store.search(gen, unit(2), 1))[0].score == pytest.approx(1.0, abs=1e-4)


async def test_swap_moves_queries_to_the_new_generation_and_drop_removes_the_old(store):
    name = f"c{uuid.uuid4().hex[:8]}"
    old = await live_generation(store, name, "1")
    assert (await store.live(name)).id == old.id

    new = await new_generation(store, name, {"a": "h", "b": "h"}, "2")
    # The other way round: a query that reads the new generation says which it read.
    await write(store, new, [("a", "h", unit(1), "a"), ("b", "h", unit(0), "b")], 2)
    await store.build_index(new)
    await store.swap(new)
    live = await store.live(name)
    assert live.id == new.id
    assert [h.chunk_id for h in await store.search(live, unit(0), 1)] == ["b"]
    # A generation no longer being built (here: retired) is never made live again, as a
    # finalize that lost its lease to a later run's could try (issue 29, item 18).
    with pytest.raises(IndexError_, match="no longer being built"):
        await store.swap(old)
    assert (await store.live(name)).id == new.id
    # The generation swapped out answers until it is dropped, then says so.
    assert [h.chunk_id for h in await store.search(old, unit(0), 1)] == ["a"]
    assert old.id in await store.drop_retired(0)
    with pytest.raises(GenerationGone):
        await store.search(old, unit(0), 1)
    assert [h.chunk_id for h in await store.search(live, unit(0), 1)] == ["b"]


async def test_swap_refuses_a_generation_whose_store_lacks_a_vector(store):
    if store.vectors().joins_transaction:
        pytest.skip("pgvector's vectors are the catalogue rows the swap counts already")
    name = f"c{uuid.uuid4().hex[:8]}"
    gen = await new_generation(store, name, {"a": "h", "b": "h"}, "1")
    await write(store, gen, [("a", "h", unit(0), "a"), ("b", "h", unit(1), "b")], 1)
    await store.vectors(gen.store).delete(gen.space, ["b"])  # lost outside herd
    with pytest.raises(IndexError_, match="lacks 1 of its 2 vectors"):
        await store.swap(gen)
    assert await store.live(name) is None
    # The chunk counts as missing again, so the next run embeds it and the swap passes.
    assert [m[0] for m in await store.missing(gen)] == ["b"]
    await write(store, gen, [("b", "h", unit(1), "b")], 2)
    await store.swap(gen)
    assert (await store.live(name)).id == gen.id


async def test_the_alias_follows_each_swap(store):
    aliased = store.backend.aliased
    if aliased is None:
        pytest.skip("this store has no aliases: herd's catalogue pointer is the alias")
    client = store.vectors().client
    name = f"c{uuid.uuid4().hex[:8]}"
    for tag in ("1", "2"):
        gen = await new_generation(store, name, {"a": "h"}, tag)
        await write(store, gen, [("a", "h", unit(0), "a")], 1)
        await store.swap(gen)
        assert aliased(client, alias(name)) == gen.space.name
