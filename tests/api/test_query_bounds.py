"""What one POST /query may cost: texts, characters, k (settings, 422 naming the field),
and query embeddings that wait for a slot of their own."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid

import pytest

from herd.builtin import tasks as builtin_tasks
from herd.config import Settings
from herd.errors import ConfigError
from herd.rag.ingest import plan_and_apply
from herd.rag.query import EmbedSlots, answer, embed_slots
from tests.api.conftest import client_of
from tests.helpers import eventually
from tests.rag.test_ingest import drain
from tests.test_cli import herd


async def refused(c, **body: object) -> tuple[int, list[str], str]:
    r = await c.post("/query", json={"collection": "nowhere", **body})
    out = r.json()
    return r.status_code, [e["field"] for e in out.get("errors", [])], out["error"]


async def test_a_query_past_a_bound_is_422_naming_the_field(pg_app):
    async with client_of(pg_app) as c:
        # The defaults: 32 texts, 2,000 characters each, k 100. 404 is past the checks.
        assert (await refused(c, texts=["x"] * 32, k=100))[0] == 404
        assert (await refused(c, texts=["x" * 2_000]))[0] == 404
        assert (await refused(c, texts=["x"] * 33))[:2] == (422, ["texts"])
        assert (await refused(c, texts=["x", "y" * 2_001]))[:2] == (422, ["texts.1"])
        status, fields, error = await refused(c, texts=["x"], k=101)
        assert (status, fields) == (422, ["k"])
        assert error == "k: 101 hits asked; a request may ask 100 (HERD_QUERY_MAX_K)"
        pg_app.settings = pg_app.settings.override(
            query_max_texts=2, query_max_chars=10, query_max_k=3
        )
        assert (await refused(c, texts=["x", "y", "z"]))[:2] == (422, ["texts"])
        status, fields, error = await refused(c, texts=["x" * 11])
        assert (status, fields) == (422, ["texts.0"])
        assert error == (
            "texts.0: 11 characters; a text may have 10 (HERD_QUERY_MAX_CHARS): shorten it"
        )
        assert (await refused(c, texts=["x"], k=4))[:2] == (422, ["k"])
        assert (await refused(c, texts=["x" * 10, "y"], k=3))[0] == 404


def test_the_bounds_are_settings_herd_config_shows_up_to_the_models_ceilings():
    env = {
        "HERD_QUERY_MAX_TEXTS": "8",
        "HERD_QUERY_MAX_CHARS": "500",
        "HERD_QUERY_MAX_K": "20",
        "HERD_QUERY_EMBED_CONCURRENCY": "3",
        "HERD_SEMANTIC_MAX_ENTRY_BYTES": "65536",
    }
    shown = json.loads(herd("config", "--json", **env).stdout)
    assert [shown[k.removeprefix("HERD_").lower()] for k in env] == list(env.values())
    for name, ceiling, unit in [
        ("HERD_QUERY_MAX_TEXTS", 100, "texts"),
        ("HERD_QUERY_MAX_CHARS", 10_000, "characters"),
        ("HERD_QUERY_MAX_K", 1_000, "hits"),
    ]:
        with pytest.raises(ConfigError) as caught:
            Settings.from_env({name: str(ceiling + 1)})
        assert str(caught.value) == f"{name} may be at most {ceiling} {unit}, not {ceiling + 1}"
    with pytest.raises(ConfigError, match="HERD_QUERY_EMBED_CONCURRENCY must be a positive"):
        Settings.from_env({"HERD_QUERY_EMBED_CONCURRENCY": "0"})


async def test_query_embeddings_wait_for_a_slot_of_their_own(pg_app, tmp_path, herd_home):
    name = f"c{uuid.uuid4().hex[:10]}"
    corpus = tmp_path / "notes.md"
    corpus.write_text(
        "# Leases\n\nA lease that is not renewed expires; another worker takes over.\n"
    )
    pg_app.settings = pg_app.settings.override(home=herd_home, query_embed_concurrency=1)
    pg_app.include(builtin_tasks)
    await plan_and_apply(pg_app, [corpus], name)
    await drain(pg_app)
    slots = embed_slots(pg_app)
    gate = threading.Event()
    holder = asyncio.create_task(slots.run(gate.wait))  # another request's embedding
    await eventually(lambda: asyncio.sleep(0, slots.running == 1))
    query = asyncio.create_task(answer(pg_app, name, ["what happens to a lease?"], 1, cache=False))
    try:
        await eventually(lambda: asyncio.sleep(0, slots.waiting == 1))
        assert not query.done() and slots.running == 1
    finally:
        gate.set()
    assert await holder
    (found,) = await query
    assert "lease" in found.hits[0]["text"]
    assert (slots.running, slots.waiting) == (0, 0)
    # HERD_SEMANTIC_MAX_ENTRY_BYTES reaches the query cache: an answer past it is not kept.
    pg_app.settings = pg_app.settings.override(semantic_max_entry_bytes=len(found.hits[0]["text"]))
    for _ in range(2):
        (again,) = await answer(pg_app, name, ["what happens to a lease?"], 1)
        assert again.cache is not None and again.cache.source == "computed"


async def test_a_slot_is_freed_when_its_thread_ends_not_when_its_caller_gives_up():
    slots = EmbedSlots(1)
    gate = threading.Event()
    first = asyncio.create_task(slots.run(gate.wait))
    await eventually(lambda: asyncio.sleep(0, slots.running == 1))
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    second = asyncio.create_task(slots.run(lambda: 5))
    try:
        await eventually(lambda: asyncio.sleep(0, slots.waiting == 1))
        assert slots.running == 1  # the cancelled caller's thread still works
    finally:
        gate.set()
    assert await second == 5
    assert (slots.running, slots.waiting) == (0, 0)
