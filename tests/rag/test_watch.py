"""`herd ingest --watch`: a collection kept in step with its folder, on the real
PostgreSQL with pgvector and real filesystem events. Embeddings are counted by a
wrapper around the real embedder; every wait is on a condition with a deadline."""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path

import pytest

from herd import App
from herd.builtin import tasks as builtin_tasks
from herd.rag.embedders import spec as specs
from herd.rag.ingest import RagRuntime
from herd.rag.query import answer
from herd.rag.watch import Sync, Watcher, WatchError, status
from tests.helpers import eventually
from tests.rag.pdfs import make_pdf
from tests.rag.test_ingest import GENESIS_1_3
from tests.rag.test_sources import STATUTE

DEADLINE = 120.0


class Counting:
    """The real embedder, counting the texts it embeds; ``gate`` can hold it."""

    def __init__(self, inner) -> None:
        self.inner, self.id, self.dim = inner, inner.id, inner.dim
        self.texts: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = 0

    def embed(self, texts):
        self.waiting += 1
        assert self.gate.wait(DEADLINE), "the gate was never opened"
        self.waiting -= 1
        self.texts += list(texts)
        return self.inner.embed(texts)

    def embed_queries(self, texts):  # queries are not what a sync embeds: not counted
        return self.inner.embed(texts)


@pytest.fixture
async def app(pg_url, herd_home):
    the_app = App(database_url=pg_url)
    the_app.settings = the_app.settings.override(home=herd_home)
    the_app.include(builtin_tasks)
    the_app.state["rag.embedder"] = Counting(specs.build(specs.NEW_COLLECTIONS, herd_home))
    async with the_app:
        yield the_app


class Watching:
    """A Watcher run as a task; ``next_sync`` waits for the next one (with a deadline)."""

    def __init__(self, app: App, folder: Path, name: str, **kw) -> None:
        self.syncs: asyncio.Queue[Sync] = asyncio.Queue()
        self.stop = asyncio.Event()
        self.watcher = Watcher(app, [folder], name, on_sync=self.syncs.put_nowait, **kw)
        self.task = asyncio.create_task(self.watcher.run(self.stop))

    async def next_sync(self) -> Sync:
        getter = asyncio.ensure_future(self.syncs.get())
        done, _ = await asyncio.wait(
            {getter, self.task}, timeout=DEADLINE, return_when=asyncio.FIRST_COMPLETED
        )
        if getter not in done:
            getter.cancel()
            if self.task.done():
                self.task.result()
            raise AssertionError(f"no sync within {DEADLINE} s")
        return getter.result()

    async def until(self, probe) -> list[Sync]:
        """Syncs until ``probe()`` holds (a burst may be seen in more than one)."""
        seen = []
        while not await probe():
            seen.append(await self.next_sync())
        return seen

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, DEADLINE)


def corpus(tmp_path: Path) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "kjv.txt").write_text("\n".join(GENESIS_1_3[:10]) + "\n")
    (folder / "guide.md").write_text("# Guide\n\n## Install\n\nRun the installer.\n\nThen wait.\n")
    (folder / "UU_7_2030.pdf").write_bytes(make_pdf(STATUTE))
    return folder


async def chunks(app: App, name: str, source: Path | None = None) -> int:
    rt = await RagRuntime.of(app)
    rows = await rt.store.fetch(
        "SELECT count(*) FROM herd_chunks WHERE collection = %s"
        " AND (%s::text IS NULL OR source = %s)",
        (name, None if source is None else str(source), None if source is None else str(source)),
    )
    return int(rows[0][0])


async def texts_of(app: App, name: str, query: str) -> list[str]:
    (found,) = await answer(app, name, [query], 1, cache=False)
    return [h["text"] for h in found.hits]


async def test_edits_deletes_and_new_files_embed_only_what_changed(app, tmp_path):
    counter: Counting = app.state["rag.embedder"]
    name = f"w{uuid.uuid4().hex[:10]}"
    folder = corpus(tmp_path)
    watching = Watching(app, folder, name)
    try:
        first = await watching.next_sync()
        assert first.full and first.added == len(counter.texts) == await chunks(app, name)
        rt = await RagRuntime.of(app)
        generation = (await rt.store.live(name)).id

        counter.texts.clear()
        lines = GENESIS_1_3[:10]
        lines[2] = "Genesis 1:3 And God said, Let there be a lighthouse by the sea."
        (folder / "kjv.txt").write_text("\n".join(lines) + "\n")
        await watching.until(
            lambda: _has(app, name, "a lighthouse by the sea", "Let there be a lighthouse")
        )
        assert counter.texts == ["And God said, Let there be a lighthouse by the sea."]

        counter.texts.clear()
        guide = folder / "guide.md"
        before = await chunks(app, name)
        assert await chunks(app, name, guide) == 2
        guide.unlink()
        await watching.until(lambda: _none(app, name, guide))
        assert counter.texts == []
        assert await chunks(app, name) == before - 2

        counter.texts.clear()
        (folder / "notes.html").write_text("<h1>Notes</h1><p>Leases expire unless renewed.</p>")
        await watching.until(lambda: _has(app, name, "leases expire", "Leases expire unless"))
        assert counter.texts == ["Leases expire unless renewed."]

        # One generation throughout: the spec did not change; its vectors match its chunks.
        live = await rt.store.live(name)
        assert live.id == generation and await rt.store.count_missing(live) == 0
        rows = await rt.store.fetch(f"SELECT count(*) FROM herd_vectors_{live.id}")
        assert rows[0][0] == await chunks(app, name)
        shown = await status(app, name)
        assert shown["watched"] and shown["pending"] == 0 and shown["lag"] == 0.0
        assert shown["last_sync"]["embedded"] == 1
    finally:
        await watching.close()
    shown = await status(app, name)
    assert not shown["watched"] and shown["stopped_at"] is not None


async def _has(app: App, name: str, query: str, text: str) -> bool:
    return any(text in t for t in await texts_of(app, name, query))


async def _none(app: App, name: str, source: Path) -> bool:
    return await chunks(app, name, source) == 0


async def test_a_burst_of_edits_is_one_sync_and_status_shows_it_pending(app, tmp_path):
    counter: Counting = app.state["rag.embedder"]
    name = f"w{uuid.uuid4().hex[:10]}"
    folder = corpus(tmp_path)
    (folder / "more.txt").write_text("\n".join(GENESIS_1_3[20:25]) + "\n")
    watching = Watching(app, folder, name)
    try:
        await watching.next_sync()
        # A sync held in the embedder: the edits below arrive while it runs.
        counter.gate.clear()
        (folder / "kjv.txt").write_text("\n".join(GENESIS_1_3[:11]) + "\n")
        await eventually(lambda: _true(counter.waiting > 0), timeout=DEADLINE)
        for n in range(3):  # ten saves of three files
            (folder / "kjv.txt").write_text("\n".join(GENESIS_1_3[: 12 + n]) + "\n")
        for n in range(4):
            (folder / "more.txt").write_text("\n".join(GENESIS_1_3[20 : 26 + n]) + "\n")
        for n in range(3):
            (folder / "guide.md").write_text(f"# Guide\n\nVersion {n}.\n")
        wanted = {str(folder / f) for f in ("kjv.txt", "more.txt", "guide.md")}
        shown = await eventually(lambda: _pending(app, name, wanted), timeout=DEADLINE)
        assert shown["watched"] and shown["syncing_for"] is not None and shown["lag"] > 0
        counter.texts.clear()
        counter.gate.set()
        held = await watching.next_sync()
        assert (held.added, held.embedded) == (1, 1)  # Genesis 1:11, before the burst
        burst = await watching.next_sync()
        assert burst.files == 3 and not burst.full
        # kjv: 1:12 to 1:14; more: 1:26 to 1:29; guide: its two chunks replaced by one.
        assert (burst.added, burst.deleted) == (3 + 4 + 1, 2)
        assert burst.embedded == len(counter.texts) - 1 == 8
    finally:
        counter.gate.set()
        await watching.close()


async def _true(value: bool) -> bool:
    return value


async def _pending(app: App, name: str, wanted: set[str]) -> dict | None:
    shown = await status(app, name)
    return shown if wanted <= set(shown["pending_files"]) else None


async def test_a_run_cut_short_resumes_embedding_each_chunk_once(app, tmp_path):
    """A watcher that stored and queued a sync but embedded nothing (a crash there): the
    next watcher's first sync embeds every chunk once, the queued jobs included."""
    counter: Counting = app.state["rag.embedder"]
    name = f"w{uuid.uuid4().hex[:10]}"
    folder = corpus(tmp_path)
    cut = Watching(app, folder, name, embed_here=False)
    first = await cut.next_sync()
    assert first.embedded > 0 and counter.texts == []
    # A second watcher is refused while the first one lives.
    with pytest.raises(WatchError, match="is watched by"):
        await Watcher(app, [folder], name).run()
    await cut.close()
    lines = GENESIS_1_3[:10]
    lines[0] = "Genesis 1:1 In the beginning was the word."
    (folder / "kjv.txt").write_text("\n".join(lines) + "\n")  # changed while unwatched
    watching = Watching(app, folder, name)
    try:
        again = await watching.next_sync()
        assert again.full and again.changed == 1
        assert sorted(counter.texts) == sorted(set(counter.texts))  # none twice
        assert len(counter.texts) == await chunks(app, name)
        assert await _has(app, name, "the beginning was the word", "was the word")
    finally:
        await watching.close()
