"""Vector stores from herd's side: HERD_VECTOR_URL's forms, one ingest and query end to
end per store outside PostgreSQL (on Genesis 1-3), and qdrant-edge's index build off the
event loop. The stores' contract is tests/contract/test_vector_store.py."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid

import numpy as np
import pytest

from herd import App
from herd.builtin import tasks as builtin_tasks
from herd.config import Settings
from herd.errors import ConfigError
from herd.rag import vectors
from herd.rag.corpora import kjv_lines
from herd.rag.ingest import RagRuntime, plan_and_apply
from herd.rag.query import answer
from herd.rag.store import RagStore
from tests.contract.backends import VECTOR_STORES
from tests.rag.support import drain

# One ingest and query end to end per store outside PostgreSQL (their contract:
# tests/contract/test_vector_store.py, on every store).
OUTSIDE = ["milvus-lite", "qdrant-edge"]


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


@pytest.mark.parametrize("kind", OUTSIDE)
async def test_ingest_and_query_answer_from_the_store(kind, request, pg_url, herd_home, tmp_path):
    app = App(database_url=pg_url)
    url = VECTOR_STORES[kind].url(request, tmp_path)
    app.settings = app.settings.override(home=herd_home, vector_url=url)
    app.include(builtin_tasks)
    (tmp_path / "kjv.txt").write_text("\n".join(GENESIS_1_3) + "\n")
    name = f"c{uuid.uuid4().hex[:8]}"
    async with app:
        plan = await plan_and_apply(app, [tmp_path / "kjv.txt"], name)
        assert plan.new_generation and plan.to_embed == len(GENESIS_1_3)
        await drain(app)
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
