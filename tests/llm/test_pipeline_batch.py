"""A pipeline's stages through the Batch API against the simulator: the maps of every
document in one provider batch, then (batched too) the reduces of every document in
another; fan-in exact, cache hits never sent, the ledger at the batch price."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from herd import App, Worker
from herd.llm import eval as evaluate
from herd.llm.eval import batchapi, control, pipebatch, stages
from herd.llm.eval.pipeline import from_json
from herd.llm.eval.pipesubmit import submit_pipeline
from herd.llm.eval.runtime import EvalRuntime
from herd.llm.eval.stageview import stage_progress
from tests.conftest import truncate
from tests.helpers import eventually
from tests.llm.conftest import SECRET, clean_eval_tables
from tests.llm.test_pipeline import NOTE, PIPE_TABLES, SUMMARY, manual

ROOT = Path(__file__).resolve().parents[2]
PRICE = {"sim-1": {"input": 2.0, "output": 8.0}}


def pipeline(map_batched: bool = True, reduce_batched: bool = False,
             reduce_prompt: str = "Sum.") -> dict:  # fmt: skip
    return {"defaults": {"model": "sim-1"}, "stages": [
        {"name": "sections", "kind": "split", "by": "headings", "depth": 2},
        {"name": "notes", "kind": "map", "prompt": "Note the finding.", "schema": NOTE,
         "batch_api": map_batched},
        {"name": "summary", "kind": "reduce", "prompt": reduce_prompt, "schema": SUMMARY,
         "batch_api": reduce_batched},
    ]}  # fmt: skip


@pytest.fixture
async def app(pg_url, sim, monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_BASE_URL", sim.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps(PRICE))
    monkeypatch.setenv("HERD_PRICES", str(prices))
    sim.configure(batch_latency=0.2)
    truncate(pg_url)
    clean_eval_tables(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {PIPE_TABLES}, herd_eval_provider_batches")
    monkeypatch.setattr(batchapi, "POLL_FIRST", 0.2)
    monkeypatch.setattr(stages, "GATHER_AFTER", 0.5)
    the_app = App(database_url=pg_url)
    for name, fn, lease in ((stages.STAGE_TASK, stages.run_stage, 5.0),
                            (stages.GATHER_TASK, pipebatch.gather_task, 5.0),
                            (evaluate.spec.SUBMIT_TASK, batchapi.batch_submit, 5.0),
                            (evaluate.spec.POLL_TASK, batchapi.batch_poll, 5.0)):  # fmt: skip
        the_app.task(name=name, queue=evaluate.QUEUE, lease_seconds=lease, max_attempts=3)(fn)
    async with the_app:
        yield the_app


def folder_of(tmp_path: Path, n: int = 3) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir(exist_ok=True)
    for d in range(n):
        (folder / f"m{d}.md").write_text(manual(f"Device {d}", 3 + d))
    return folder


async def work_until(app: App, done: Callable[[], object]) -> None:
    worker = Worker(app, queues=[evaluate.QUEUE], concurrency=4, poll_interval=0.05,
                    install_signal_handlers=False)  # fmt: skip
    running = asyncio.create_task(worker.run())
    try:
        await eventually(done, timeout=60, interval=0.1)
    finally:
        worker.stop()
        await running


async def finals(app: App, batch: str) -> list[tuple[str, str, dict]]:
    rt = await EvalRuntime.of(app)
    rows = await rt.store.execute(
        "SELECT path, status, result FROM herd_eval_items WHERE batch = %s ORDER BY path",
        (batch,),
    )
    return [(p, s, r) for p, s, r in rows]


async def all_final(app: App, batch: str, n: int) -> bool:
    rows = await finals(app, batch)
    return len(rows) == n and all(s == "done" for _, s, _ in rows)


async def ledger(app: App, batch: str) -> list[tuple[str, str, float, int, int]]:
    rt = await EvalRuntime.of(app)
    rows = await rt.store.execute(
        "SELECT l.kind, j.task, l.cost::float8, l.input_tokens, l.output_tokens"
        " FROM herd_eval_ledger l LEFT JOIN herd_jobs j ON j.id = l.job_id"
        " WHERE l.batch = %s AND l.kind = 'call'",
        (batch,),
    )
    return [tuple(r) for r in rows]


# 3 documents: an introduction and 3, 4, 5 registers: 4 + 5 + 6 map pieces.
MAPS, DOCS = 15, 3


async def reduces_of(app: App, batch: str) -> list[tuple[str, int]]:
    rt = await EvalRuntime.of(app)
    rows = await rt.store.execute(
        "SELECT path, count(*) FROM herd_eval_pieces WHERE batch = %s AND stage = 'summary'"
        " GROUP BY path ORDER BY path",
        (batch,),
    )
    return [(p, int(n)) for p, n in rows]


async def test_a_batched_map_is_one_provider_batch_and_each_document_reduces_once(
    app, sim, tmp_path
):
    folder = folder_of(tmp_path)
    pipe = from_json(pipeline(map_batched=True))
    report = await submit_pipeline(app, [folder], pipe, batch="pb1")
    assert report.queued == MAPS
    await work_until(app, lambda: all_final(app, "pb1", DOCS))
    stats = sim.stats()
    # Every map in one provider batch; each document's reduce one synchronous call.
    assert stats["batches"]["created"] == 1 and stats["batch_billed"] == MAPS
    assert stats["calls"] == DOCS
    rows = await finals(app, "pb1")
    assert [(s, r["stage"], set(r["output"])) for _, s, r in rows] == [
        ("done", "summary", {"summary"})] * DOCS  # fmt: skip
    assert [n for _, n in await reduces_of(app, "pb1")] == [1] * DOCS
    # The maps are ledgered by the poll job at the batch price (half of 2.0 and 8.0).
    calls = await ledger(app, "pb1")
    maps = [c for c in calls if c[1] == evaluate.spec.POLL_TASK]
    assert len(maps) == MAPS and len(calls) == MAPS + DOCS
    for _, _, cost, i, o in maps:
        assert cost == pytest.approx((i * 1.0 + o * 4.0) / 1e6)
    rt = await EvalRuntime.of(app)
    progress = {s["stage"]: s for s in await stage_progress(rt, "pb1")}
    assert (progress["notes"]["done"], progress["notes"]["calls"]) == (MAPS, MAPS)
    assert (progress["summary"]["done"], progress["summary"]["calls"]) == (DOCS, DOCS)


async def test_both_stages_batched_make_two_provider_batches_and_hits_are_not_sent(
    app, sim, tmp_path
):
    folder = folder_of(tmp_path)
    pipe = from_json(pipeline(map_batched=True, reduce_batched=True))
    await submit_pipeline(app, [folder], pipe, batch="pb2")
    await work_until(app, lambda: all_final(app, "pb2", DOCS))
    stats = sim.stats()
    # The maps of every document in one provider batch, their reduces in another.
    assert stats["batches"]["created"] == 2 and stats["batch_billed"] == MAPS + DOCS
    assert stats["calls"] == 0
    assert [n for _, n in await reduces_of(app, "pb2")] == [1] * DOCS
    rows = await finals(app, "pb2")
    assert all(s == "done" and r["stage"] == "summary" for _, s, r in rows)
    calls = await ledger(app, "pb2")
    assert len(calls) == MAPS + DOCS
    assert all(c[1] == evaluate.spec.POLL_TASK for c in calls)

    # Again with a new reduce prompt: the maps are cache hits, never sent (a job each
    # reads the cache); only the reduces are requested. The maps' jobs end one by one,
    # so the reduces are gathered as they come: one provider batch, or a few.
    pipe2 = from_json(pipeline(map_batched=True, reduce_batched=True, reduce_prompt="Other."))
    await submit_pipeline(app, [folder], pipe2, batch="pb3")
    await work_until(app, lambda: all_final(app, "pb3", DOCS))
    stats = sim.stats()
    assert stats["batch_billed"] == MAPS + 2 * DOCS and stats["calls"] == 0
    assert 3 <= stats["batches"]["created"] <= 2 + DOCS
    assert [n for _, n in await reduces_of(app, "pb3")] == [1] * DOCS
    rt = await EvalRuntime.of(app)
    progress = {s["stage"]: s for s in await stage_progress(rt, "pb3")}
    assert progress["notes"]["cached"] == MAPS and progress["summary"]["calls"] == DOCS


async def test_synchronous_maps_then_a_batched_reduce_share_one_provider_batch(app, sim, tmp_path):
    folder = folder_of(tmp_path)
    pipe = from_json(pipeline(map_batched=False, reduce_batched=True))
    await submit_pipeline(app, [folder], pipe, batch="pb4")
    await work_until(app, lambda: all_final(app, "pb4", DOCS))
    stats = sim.stats()
    assert stats["calls"] == MAPS and stats["batch_billed"] == DOCS
    # Reduces decided one by one are gathered: at most one provider batch per document,
    # and each document reduced once.
    assert 1 <= stats["batches"]["created"] <= DOCS
    assert [n for _, n in await reduces_of(app, "pb4")] == [1] * DOCS


async def test_cancelling_a_batched_pipeline_cancels_its_provider_batch_and_pieces(
    app, sim, tmp_path
):
    sim.configure(batch_latency=30.0)  # the provider batch is still running when cancelled
    folder = folder_of(tmp_path)
    pipe = from_json(pipeline(map_batched=True, reduce_batched=True))
    await submit_pipeline(app, [folder], pipe, batch="pb5")
    rt = await EvalRuntime.of(app)

    async def polling() -> bool:
        rows = await rt.store.execute(
            "SELECT count(*) FROM herd_eval_provider_batches WHERE state = 'polling'"
        )
        return rows[0][0] == 1

    await work_until(app, polling)
    out = await control.cancel(app, "pb5")
    assert len(out["provider_batches"]) == 1 and out["cancelled_items"] == DOCS

    async def pieces_ended() -> bool:
        rows = await rt.store.execute(
            "SELECT count(*) FILTER (WHERE status = 'queued'), count(*) FROM herd_eval_pieces"
            " WHERE batch = 'pb5'"
        )
        return rows[0][0] == 0 and rows[0][1] >= MAPS

    await work_until(app, pieces_ended)
    assert sim.stats()["batches"]["created"] == 1 and sim.stats()["calls"] == 0
    assert {s for _, s, _ in await finals(app, "pb5")} == {"cancelled"}


def test_the_batch_api_flag_batches_every_model_stage_and_keeps_the_keys():
    pipe = from_json(pipeline(map_batched=False))
    both = pipe.through_batch_api()
    assert pipe.batched == [] and both.batched == ["notes", "summary"]
    assert [both.spec(s).hash for s in both.calls] == [pipe.spec(s).hash for s in pipe.calls]


def _worker(pg_url: str, sim, log: Path, crash_at: str | None) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HERD_DATABASE_URL=pg_url,
               OPENAI_BASE_URL=sim.openai_url, OPENAI_API_KEY=SECRET)  # fmt: skip
    env.pop("HERD_TEST_CRASH_AT", None)
    if crash_at:
        env["HERD_TEST_CRASH_AT"] = crash_at
    return subprocess.Popen(
        [sys.executable, "-m", "herd", "worker", "tests.apps.pipe_batch_crash:app",
         "--queue", evaluate.QUEUE, "--poll-interval", "0.1", "--concurrency", "2",
         "--grace", "5"],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log.open("wb"),
    )  # fmt: skip


@pytest.mark.timeout(150)
async def test_a_worker_killed_after_creating_the_maps_batch_makes_no_second_one(
    app, sim, pg_url, tmp_path
):
    folder = folder_of(tmp_path)
    pipe = from_json(pipeline(map_batched=True, reduce_batched=True))
    await submit_pipeline(app, [folder], pipe, batch="pb6")
    first = _worker(pg_url, sim, tmp_path / "first.log", "after_create")
    try:
        code = await asyncio.to_thread(first.wait, 60)
        assert code == 137, (tmp_path / "first.log").read_text()
    finally:
        if first.poll() is None:
            first.kill()
    assert sim.stats()["batches"]["created"] == 1  # made, then killed before recording it
    second = _worker(pg_url, sim, tmp_path / "second.log", None)
    try:
        await eventually(lambda: all_final(app, "pb6", DOCS), timeout=90, interval=0.2)
        second.terminate()
        assert await asyncio.to_thread(second.wait, 20) == 0
    finally:
        if second.poll() is None:
            second.kill()
    stats = sim.stats()
    # The maps' provider batch found by its handle, not made again; then the reduces'.
    assert stats["batches"]["created"] == 2 and stats["batch_billed"] == MAPS + DOCS
    assert [n for _, n in await reduces_of(app, "pb6")] == [1] * DOCS
    assert len(await ledger(app, "pb6")) == MAPS + DOCS
