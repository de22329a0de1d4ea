"""One contract for every vector store this machine runs: pgvector (in the suite's
PostgreSQL), Milvus Lite, qdrant-client's local mode and qdrant-edge, each real.

Each store is driven through herd's catalogue (``RagStore``), as ingest and
queries drive it; then one ingest and query end to end per store outside
PostgreSQL, on Genesis 1-3.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from psycopg.types.json import Jsonb

from herd import App, Worker
from herd.builtin import tasks as builtin_tasks
from herd.config import Settings
from herd.errors import ConfigError
from herd.rag import ingest, vectors
from herd.rag.corpora import kjv_lines
from herd.rag.errors import GenerationGone, IndexError_
from herd.rag.ingest import RagRuntime, plan_and_apply
from herd.rag.query import answer
from herd.rag.store import RagStore
from herd.rag.vectors.engine import alias

STORES = ["pgvector", "milvus", "qdrant", "qdrant+edge"]
DIM = 8


def store_url(kind: str, folder: Path) -> str:
    return {
        "pgvector": "pgvector",
        "milvus": f"milvus://{folder}/vectors.db",
        "qdrant": f"qdrant://{folder}/qdrant",
        "qdrant+edge": f"qdrant+edge://{folder}/edge",
    }[kind]


@pytest.fixture(params=STORES)
async def store(request, pg_url, tmp_path):
    catalogue = RagStore(pg_url, vector_url=store_url(request.param, tmp_path))
    await catalogue.open()
    yield catalogue
    await catalogue.close()


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
    # timestamp, on every scan): herd ingest's user could do nothing about it.
    assert "WARNING" not in "".join(capfd.readouterr())


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
    gen = await new_generation(store, name, {"a": "h", "b": "h"}, "1")
    await write(store, gen, [("a", "h", unit(0), "a"), ("b", "h", unit(1), "b")], 1)
    await store.build_index(gen)
    await store.swap(gen)
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
    old = await new_generation(store, name, {"a": "h", "b": "h"}, "1")
    await write(store, old, [("a", "h", unit(0), "a"), ("b", "h", unit(1), "b")], 1)
    await store.build_index(old)
    await store.swap(old)
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


@pytest.mark.parametrize(
    "url",
    ["redis://x", "milvus://", "milvus:///tmp/x.sqlite", "qdrant+edge://host:1/p", "qdrant:x"],
)
def test_a_bad_vector_url_names_the_variable_and_the_forms(url, pg_url):
    with pytest.raises(ConfigError, match=r"HERD_VECTOR_URL .* use one of pgvector, milvus:"):
        RagStore(pg_url, vector_url=Settings.from_env({"HERD_VECTOR_URL": url}).vector_url)


def test_herd_ingest_refuses_a_bad_vector_url_as_a_usage_error(tmp_path):
    (tmp_path / "a.txt").write_text("Some text.\n")
    env = {**os.environ, "HERD_VECTOR_URL": "milvus:///tmp/x.sqlite", "HERD_HOME": str(tmp_path)}
    r = subprocess.run(
        [sys.executable, "-m", "herd", "ingest", str(tmp_path / "a.txt"), "--collection", "c"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "HERD_VECTOR_URL" in r.stderr
    assert "use one of pgvector, milvus:" in r.stderr


def test_a_vector_url_records_its_place_without_credentials():
    url = vectors.parse("qdrant://:s3cret-key@db.example:7000")
    assert (url.location, url.password) == ("qdrant://db.example:7000", "s3cret-key")
    assert vectors.resolve("qdrant://db.example:7000", url) is url
    assert vectors.parse(None).location == "pgvector"


GENESIS_1_3 = [line for line in kjv_lines(1) if line.split()[1].split(":")[0] in ("1", "2", "3")]


@pytest.mark.parametrize("kind", ["milvus", "qdrant+edge"])
async def test_ingest_and_query_answer_from_the_store(kind, pg_url, herd_home, tmp_path):
    app = App(database_url=pg_url)
    url = store_url(kind, tmp_path)
    app.settings = app.settings.override(home=herd_home, vector_url=url)
    app.include(builtin_tasks)
    (tmp_path / "kjv.txt").write_text("\n".join(GENESIS_1_3) + "\n")
    name = f"c{uuid.uuid4().hex[:8]}"
    async with app:
        plan = await plan_and_apply(app, [tmp_path / "kjv.txt"], name)
        assert plan.new_generation and plan.to_embed == len(GENESIS_1_3)
        await Worker(
            app, queues=[ingest.QUEUE], concurrency=2, poll_interval=0.05,
            stop_when_idle=True, install_signal_handlers=False,
        ).run()  # fmt: skip
        rt = await RagRuntime.of(app)
        live = await rt.store.live(name)
        assert live is not None and live.store == vectors.parse(url).location
        held = await rt.store.vectors(live.store).inventory(live.space)
        assert len(held) == len(GENESIS_1_3)
        found = await answer(
            app, name, ["In the beginning God created the heaven and the earth"], 3,
            cache=False, mode="dense",
        )  # fmt: skip
        assert found[0].hits[0]["id"] == "kjv/genesis/1/1"

    # Another process configured for pgvector still reads the generation where it was
    # built, and would index the collection anew (in its own store) rather than mix.
    other = App(database_url=pg_url)
    other.settings = other.settings.override(home=herd_home)
    other.include(builtin_tasks)
    async with other:
        again = await answer(
            other, name, ["In the beginning God created the heaven and the earth"], 1,
            cache=False, mode="dense",
        )  # fmt: skip
        assert again[0].hits[0]["id"] == "kjv/genesis/1/1"
        plan = await plan_and_apply(other, [tmp_path / "kjv.txt"], name, apply=False)
        assert plan.new_generation and plan.to_embed == len(GENESIS_1_3)


def aliased(store: RagStore, collection: str) -> str:
    """The collection the store's alias for ``collection`` names, asked of the store itself."""
    client, name = store.vectors().client, alias(collection)
    if store.vector_url.scheme == "milvus":
        return client.describe_alias(name)["collection_name"]
    return {a.alias_name: a.collection_name for a in client.get_aliases().aliases}[name]


@pytest.mark.parametrize("kind", ["milvus", "qdrant"])
async def test_the_alias_follows_each_swap(kind, pg_url, tmp_path):
    store = RagStore(pg_url, vector_url=store_url(kind, tmp_path))
    await store.open()
    try:
        name = f"c{uuid.uuid4().hex[:8]}"
        for tag in ("1", "2"):
            gen = await new_generation(store, name, {"a": "h"}, tag)
            await write(store, gen, [("a", "h", unit(0), "a")], 1)
            await store.swap(gen)
            assert aliased(store, name) == gen.space.name
    finally:
        await store.close()


async def test_building_edge_s_index_leaves_the_event_loop_running(tmp_path):
    """qdrant-edge's optimize holds the GIL for its whole run; in the worker's process it
    stopped the heartbeats, and the finalize job lost its lease. 10,000 points of 256
    floats are past its indexing threshold: about 3 s of HNSW building here."""
    from herd.rag.vectors import Row, Space, open_store, parse

    edge = open_store(parse(f"qdrant+edge://{tmp_path}/edge"), None)
    try:
        space, rng = Space(1, "big", 256), np.random.default_rng(0)
        await edge.create(None, space)
        for at in range(0, 10_000, 2_000):
            block = rng.standard_normal((2_000, 256)).astype(np.float32)
            rows = [Row(f"c{at + i}", "h", v, "") for i, v in enumerate(block)]
            await edge.upsert(None, space, rows, 1)
        gaps, building = [], asyncio.create_task(edge.prepare(space))
        last = asyncio.get_running_loop().time()
        while not building.done():
            await asyncio.sleep(0.02)
            now = asyncio.get_running_loop().time()
            gaps.append(now - last)
            last = now
        await building
        assert max(gaps) < 1.0, f"the loop stalled {max(gaps):.1f} s"
        found = await edge.search(space, block[7], 1, 64)  # the shard reopens after its build
        assert found[0][0] == "c8007"
    finally:
        await edge.close()
