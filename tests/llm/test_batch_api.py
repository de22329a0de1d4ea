"""Evaluations through OpenAI's Batch API against the simulator: one provider batch per
herd batch, even when the submitting worker is SIGKILLed at each step."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from herd import App, Worker
from herd.llm import eval as evaluate
from herd.llm.errors import ProviderError
from herd.llm.eval import EvalSpec, batchapi, submit
from herd.llm.providers.anthropic_batch import CLOCK_SKEW
from herd.llm.providers.batch import Found
from tests.apps.batch_crash import CRASH_POINTS
from tests.conftest import truncate
from tests.helpers import eventually
from tests.llm.conftest import SECRET, Sim, clean_eval_tables

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = {
    "type": "object",
    "properties": {"score": {"type": "integer"}, "summary": {"type": "string"}},
    "required": ["score", "summary"],
    "additionalProperties": False,
}
SPEC = EvalSpec(model="sim-1", system="Rate the paper from 1 to 10.", schema=SCHEMA)
OWN = {"authorization": f"Bearer {SECRET}"}


@pytest.fixture
async def app(pg_url, sim, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", sim.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    sim.configure(batch_latency=0.2)
    truncate(pg_url)
    clean_eval_tables(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("TRUNCATE herd_eval_provider_batches")
    the_app = App(database_url=pg_url)
    # Short leases: a killed submitter's job is taken over within a second.
    the_app.task(name=evaluate.TASK, queue=evaluate.QUEUE, lease_seconds=1.0, max_attempts=2)(
        evaluate.task.evaluate
    )
    the_app.task(name=evaluate.spec.SUBMIT_TASK, queue=evaluate.QUEUE, lease_seconds=1.0)(
        batchapi.batch_submit
    )
    the_app.task(name=evaluate.spec.POLL_TASK, queue=evaluate.QUEUE, lease_seconds=5.0)(
        batchapi.batch_poll
    )
    async with the_app:
        yield the_app


def docs(tmp_path: Path, n: int) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir(exist_ok=True)
    for i in range(n):
        (folder / f"p{i}.txt").write_text(f"Paper {i}.\nIt has results number {i}.\n")
    return folder


async def items(app: App) -> list[tuple[str, str | None]]:
    rt = await evaluate.EvalRuntime.of(app)
    rows = await rt.store.execute("SELECT status, source FROM herd_eval_items ORDER BY path")
    return [(s, src) for s, src in rows]


async def all_done(app: App, n: int) -> bool:
    found = await items(app)
    return len(found) == n and all(s == "done" for s, _ in found)


async def calls(app: App) -> int:
    rt = await evaluate.EvalRuntime.of(app)
    ((n,),) = await rt.store.execute("SELECT count(*) FROM herd_eval_ledger WHERE kind = 'call'")
    return int(n)


def uploaded(sim: Sim) -> list[dict]:
    # The files of this test's key: the simulator keeps each key's files and batches apart.
    files = sim.http.get("/v1/files", params={"purpose": "batch"}, headers=OWN).json()["data"]
    return [f for f in files if f["filename"].startswith("herd-")]


async def work_until(app: App, done) -> None:
    worker = Worker(app, queues=[evaluate.QUEUE], concurrency=4, poll_interval=0.05,
                    install_signal_handlers=False)  # fmt: skip
    running = asyncio.create_task(worker.run())
    try:
        await eventually(done, timeout=30, interval=0.1)
    finally:
        worker.stop()
        await running


async def test_a_batch_goes_to_the_batch_api_once_and_fans_out_at_the_batch_price(
    app, sim, tmp_path, monkeypatch
):
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"sim-1": {"input": 2.0, "output": 8.0}}))
    monkeypatch.setenv("HERD_PRICES", str(prices))
    folder = docs(tmp_path, 5)
    (folder / "dup.txt").write_text("Paper 0.\nIt has results number 0.\n")  # same as p0
    report = await submit(app, [folder], SPEC, batch="b1", batch_api=True)
    assert (report.queued, report.deduplicated) == (5, 1)
    assert len(set(report.job_ids)) == 1  # one submit job for the whole chunk
    await work_until(app, lambda: all_done(app, 6))

    stats = sim.stats()
    assert stats["batches"]["created"] == 1 and stats["batch_billed"] == 5
    assert stats["billed"] == 0  # no synchronous call
    assert {src for _, src in await items(app)} == {"batch"}
    assert await calls(app) == 5
    rt = await evaluate.EvalRuntime.of(app)
    ((cost, i, o),) = await rt.store.execute(
        "SELECT sum(cost)::float8, sum(input_tokens), sum(output_tokens) FROM herd_eval_ledger"
        " WHERE kind = 'call'"
    )
    assert cost == pytest.approx((int(i) * 1.0 + int(o) * 4.0) / 1e6)  # half of 2.0 and 8.0
    ((result,),) = await rt.store.execute(
        "SELECT result FROM herd_eval_items WHERE path LIKE %s", ("%p3.txt",)
    )
    assert set(result["output"]) == {"score", "summary"} and result["path"].endswith("p3.txt")
    # The answers are in the exact cache: the same documents again make no request.
    again = await submit(app, [folder], SPEC, batch="b2", batch_api=True)
    await work_until(app, lambda: all_done(app, 12))
    assert sim.stats()["batches"]["created"] == 1 and again.queued == 5


async def test_a_document_the_cache_holds_is_not_sent(app, sim, tmp_path):
    folder = docs(tmp_path, 1)
    await submit(app, [folder], SPEC, batch="sync")  # p0 answered synchronously first
    await work_until(app, lambda: all_done(app, 1))
    docs(tmp_path, 3)
    await submit(app, [folder], SPEC, batch="b", batch_api=True)
    await work_until(app, lambda: all_done(app, 4))
    (sent,) = uploaded(sim)
    lines = sim.http.get(f"/v1/files/{sent['id']}/content", headers=OWN).text.splitlines()
    assert len(lines) == 2
    cached = SPEC.key("Paper 0.\nIt has results number 0.")
    assert cached not in {json.loads(x)["custom_id"] for x in lines}
    assert sim.stats()["batch_billed"] == 2


def _worker(pg_url: str, sim: Sim, log: Path, crash_at: str | None) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HERD_DATABASE_URL=pg_url,
               OPENAI_BASE_URL=sim.openai_url, OPENAI_API_KEY=SECRET,
               ANTHROPIC_BASE_URL=sim.url, ANTHROPIC_API_KEY=SECRET)  # fmt: skip
    env.pop("HERD_TEST_CRASH_AT", None)
    if crash_at:
        env["HERD_TEST_CRASH_AT"] = crash_at
    return subprocess.Popen(
        [sys.executable, "-m", "herd", "worker", "tests.apps.batch_crash:app",
         "--queue", evaluate.QUEUE, "--poll-interval", "0.1", "--concurrency", "2", "--grace", "5"],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log.open("wb"),
    )  # fmt: skip


@pytest.mark.timeout(90)
@pytest.mark.parametrize("step", CRASH_POINTS)
async def test_a_submitter_killed_at_each_step_makes_one_provider_batch(
    app, sim, pg_url, tmp_path, step
):
    report = await submit(app, [docs(tmp_path, 4)], SPEC, batch="k", batch_api=True)
    assert report.queued == 4
    first = _worker(pg_url, sim, tmp_path / "first.log", step)
    try:
        assert await asyncio.to_thread(first.wait, 30) == 137, (tmp_path / "first.log").read_text()
    finally:
        if first.poll() is None:
            first.kill()
    second = _worker(pg_url, sim, tmp_path / "second.log", None)
    try:
        await eventually(lambda: all_done(app, 4), timeout=40, interval=0.1)
        second.terminate()
        assert await asyncio.to_thread(second.wait, 20) == 0
    finally:
        if second.poll() is None:
            second.kill()
    stats = sim.stats()
    assert stats["batches"]["created"] == 1, stats["batches"]
    assert len(uploaded(sim)) == 1
    assert stats["batch_billed"] == 4 == await calls(app)
    job = await app.get_job(report.job_ids[0])
    assert job.stalls >= 1  # it was taken over, not run once


async def test_expired_requests_go_once_through_the_synchronous_path(app, sim, tmp_path):
    sim.configure(batch_expire=True)  # the batch answers nothing and ends expired
    await submit(app, [docs(tmp_path, 3)], SPEC, batch="x", batch_api=True)
    await work_until(app, lambda: all_done(app, 3))
    stats = sim.stats()
    assert stats["batches"]["created"] == 1 and stats["batch_billed"] == 0
    assert stats["billed"] == 3  # one synchronous call each
    # Computed, or read from the cache by a retry job that a poll re-run (its lease lost
    # under load) enqueued after the first had answered: never a second call.
    sources = {src for _, src in await items(app)}
    assert "computed" in sources and sources <= {"computed", "hit"}, sources
    assert await calls(app) == 3
    rt = await evaluate.EvalRuntime.of(app)
    ((state, status),) = await rt.store.execute(
        "SELECT state, status FROM herd_eval_provider_batches"
    )
    assert (state, status) == ("done", "expired")


async def test_the_http_api_takes_batch_api_and_refuses_what_it_cannot_keep(app, sim):
    from tests.api.conftest import client_of

    body = {"model": "sim-1", "system": "s", "documents": [{"name": "a", "text": "A paper."}],
            "batch_api": True}  # fmt: skip
    async with client_of(app) as c:
        for extra in ({"budget": 1.0}, {"rpm": 10}):
            r = await c.post("/evals", json={**body, **extra})
            assert r.status_code == 422 and "batch_api" in r.text, r.text
        assert await app.list_jobs() == []
        r = await c.post("/evals", json={**body, "batch": "api"})
        assert r.status_code == 201, r.text
    (job,) = await app.list_jobs()
    assert job.task == evaluate.spec.SUBMIT_TASK


def test_the_cli_refuses_batch_api_with_a_budget_as_a_usage_error(tmp_path):
    from tests.test_cli import herd

    doc, prompt = tmp_path / "a.txt", tmp_path / "prompt.txt"
    doc.write_text("A paper.")
    prompt.write_text("Rate it.")
    r = herd("eval", "submit", str(doc), "--prompt", str(prompt), "--model", "sim-1",
             "--batch-api", "--budget", "1", url="postgresql://herd@127.0.0.1:9/none",
             COLUMNS="200")  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "--batch-api" in r.stderr and "budget" in r.stderr and "Traceback" not in r.stderr


async def test_a_done_provider_batch_is_purged_and_an_open_one_kept(app):
    rt = await evaluate.EvalRuntime.of(app)
    for handle, state in (("h-done", "done"), ("h-open", "polling"), ("h-new", "done")):
        age = "0 s" if handle == "h-new" else "2 hours"
        await rt.store.execute(
            "INSERT INTO herd_eval_provider_batches (handle, chunk, batch, spec, provider,"
            " state, updated_at) VALUES (%s, %s, 'b', 's', 'openai', %s,"
            " now() - %s::interval)",
            (handle, handle, state, age),
        )
    await rt.store.purge(eval_ttl=3600)
    rows = await rt.store.execute("SELECT handle FROM herd_eval_provider_batches ORDER BY 1")
    assert [h for (h,) in rows] == ["h-new", "h-open"]


# Anthropic's Message Batches: no file, no metadata; the handle rides in the custom_ids.

ANTH_SPEC = EvalSpec(model="sim-1", provider="anthropic", system=SPEC.system, schema=SCHEMA)


@pytest.fixture
def anthropic_env(sim, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_BASE_URL", sim.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)


def anthropic_batches(sim: Sim) -> list[dict]:
    headers = {"x-api-key": SECRET, "anthropic-version": "2023-06-01"}
    return sim.http.get("/v1/messages/batches", headers=headers).json()["data"]


async def test_an_anthropic_batch_goes_to_message_batches_once_at_the_batch_price(
    app, sim, tmp_path, monkeypatch, anthropic_env
):
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"sim-1": {"input": 2.0, "output": 8.0}}))
    monkeypatch.setenv("HERD_PRICES", str(prices))
    folder = docs(tmp_path, 4)
    (folder / "dup.txt").write_text("Paper 1.\nIt has results number 1.\n")  # same as p1
    report = await submit(app, [folder], ANTH_SPEC, batch="a1", batch_api=True)
    assert (report.queued, report.deduplicated) == (4, 1)
    await work_until(app, lambda: all_done(app, 5))

    stats = sim.stats()
    assert stats["batches"]["created_by_api"] == {"openai": 0, "anthropic": 1}
    assert stats["batch_billed"] == 4 and stats["billed"] == 0
    assert {src for _, src in await items(app)} == {"batch"}
    assert await calls(app) == 4
    rt = await evaluate.EvalRuntime.of(app)
    ((cost, i, o),) = await rt.store.execute(
        "SELECT sum(cost)::float8, sum(input_tokens), sum(output_tokens) FROM herd_eval_ledger"
        " WHERE kind = 'call'"
    )
    assert cost == pytest.approx((int(i) * 1.0 + int(o) * 4.0) / 1e6)  # half of 2.0 and 8.0
    # Every request's custom_id carries the handle: how a takeover finds the batch.
    ((handle, batch_id),) = await rt.store.execute(
        "SELECT handle, provider_batch_id FROM herd_eval_provider_batches"
    )
    (listed,) = anthropic_batches(sim)
    assert listed["id"] == batch_id
    headers = {"x-api-key": SECRET, "anthropic-version": "2023-06-01"}
    lines = sim.http.get(f"/v1/messages/batches/{batch_id}/results", headers=headers).text
    custom_ids = {json.loads(x)["custom_id"] for x in lines.splitlines()}
    assert len(custom_ids) == 4
    assert all(len(c) == 64 and c.startswith(handle[:20] + "-") for c in custom_ids)
    # The answers are in the exact cache: the same documents again make no request.
    await submit(app, [folder], ANTH_SPEC, batch="a2", batch_api=True)
    await work_until(app, lambda: all_done(app, 10))
    assert sim.stats()["batches"]["created"] == 1


@pytest.mark.timeout(90)
@pytest.mark.parametrize("step", ["after_record_handle", "after_create"])
async def test_an_anthropic_submitter_killed_at_each_step_makes_one_message_batch(
    app, sim, pg_url, tmp_path, step, anthropic_env
):
    report = await submit(app, [docs(tmp_path, 4)], ANTH_SPEC, batch="k", batch_api=True)
    assert report.queued == 4
    first = _worker(pg_url, sim, tmp_path / "first.log", step)
    try:
        assert await asyncio.to_thread(first.wait, 30) == 137, (tmp_path / "first.log").read_text()
    finally:
        if first.poll() is None:
            first.kill()
    second = _worker(pg_url, sim, tmp_path / "second.log", None)
    try:
        await eventually(lambda: all_done(app, 4), timeout=40, interval=0.1)
        second.terminate()
        assert await asyncio.to_thread(second.wait, 20) == 0
    finally:
        if second.poll() is None:
            second.kill()
    stats = sim.stats()
    assert stats["batches"]["created_by_api"] == {"openai": 0, "anthropic": 1}, stats["batches"]
    assert stats["batch_billed"] == 4 == await calls(app)
    job = await app.get_job(report.job_ids[0])
    assert job.stalls >= 1  # it was taken over, not run once


async def test_anthropic_find_waits_on_a_batch_in_progress_it_cannot_rule_out(sim, anthropic_env):
    from herd.errors import Snooze
    from herd.llm.providers.anthropic_batch import AnthropicBatch
    from herd.llm.providers.batch import Request

    sim.configure(batch_latency=30)
    api = AnthropicBatch(model="sim-1")
    try:
        theirs = batchapi.new_handle()
        marker = await api.upload(theirs, [Request("a" * 64, "s", "u", None, {})])
        await api.create(theirs, marker)
        # In progress, made after the handle: it may be the handle's, so no second one.
        with pytest.raises(Snooze):
            await api.find(batchapi.new_handle())
        # A handle made after it (beyond the clock skew) cannot own it.
        later = f"{int((time.time() + 2 * CLOCK_SKEW) * 1000):012x}" + "0" * 20
        assert await api.find(later) == Found()
        # Keys that share all but their last character get ids of their own: a custom_id
        # carries its whole key.
        handle = batchapi.new_handle()
        ids = [api.custom_id(handle, "b" * 63 + c) for c in "01"]
        assert ids[0] != ids[1] and all(len(i) == 64 for i in ids)
    finally:
        await api.aclose()


# Result lines: matched exactly, read line by line, never lost to one bad line.


async def poll_result(app: App, submit_job: int) -> dict:
    job = await app.get_job(submit_job)
    return (await app.get_job(job.result["poll_job"])).result


async def ledger_kinds(app: App) -> dict[str, int]:
    rt = await evaluate.EvalRuntime.of(app)
    rows = await rt.store.execute("SELECT kind, count(*) FROM herd_eval_ledger GROUP BY kind")
    return {k: int(n) for k, n in rows}


@pytest.mark.parametrize("spec", [SPEC, ANTH_SPEC], ids=["openai", "anthropic"])
async def test_result_lines_answer_only_the_key_their_custom_id_names_exactly(
    app, sim, tmp_path, spec, anthropic_env
):
    # A line with custom_id "", the last answer under its id cut in half (which the
    # prefix match took for its key's), the first line twice.
    sim.configure(batch_result_faults=["empty_id", "unknown_id", "duplicate"])
    report = await submit(app, [docs(tmp_path, 3)], spec, batch="ids", batch_api=True)
    await work_until(app, lambda: all_done(app, 3))
    stats = sim.stats()
    assert stats["batches"]["created"] == 1 and stats["batch_billed"] == 3
    # The cut id answered nothing: its document went once through the synchronous path.
    assert stats["billed"] == 1
    sources = sorted(src for _, src in await items(app))
    assert sources[:2] == ["batch", "batch"] and sources[2] in ("computed", "hit"), sources
    found = await poll_result(app, report.job_ids[0])
    assert (found["unknown_ids"], found["duplicate_ids"], found["bad_lines"]) == (2, 1, 0)
    # The duplicate is filed once; the two unknown lines were answers the provider
    # bills, so each has a 'failed' row of its own.
    assert await ledger_kinds(app) == {"call": 3, "failed": 2}


@pytest.mark.parametrize("spec", [SPEC, ANTH_SPEC], ids=["openai", "anthropic"])
async def test_a_malformed_result_line_is_counted_and_the_rest_of_the_batch_filed(
    app, sim, tmp_path, spec, anthropic_env
):
    # A line that is not JSON, and the first line's response (result) a string.
    sim.configure(batch_result_faults=["not_json", "not_object"])
    report = await submit(app, [docs(tmp_path, 3)], spec, batch="bad", batch_api=True)
    await work_until(app, lambda: all_done(app, 3))
    stats = sim.stats()
    assert stats["batches"]["created"] == 1 and stats["batch_billed"] == 3
    assert stats["billed"] == 1  # the unreadable line's document, retried once
    sources = sorted(src for _, src in await items(app))
    assert sources[:2] == ["batch", "batch"] and sources[2] in ("computed", "hit"), sources
    found = await poll_result(app, report.job_ids[0])
    assert found["bad_lines"] == 2 and found["answered"] == 2
    assert await ledger_kinds(app) == {"call": 3}  # both readable batch lines, the retry


async def test_the_result_parser_reads_one_line_at_a_time():
    from herd.llm.providers.openai_batch import OpenAIBatch

    api = OpenAIBatch("http://127.0.0.1:9", "k", model="sim-1")
    read = 0

    async def lines():
        nonlocal read
        answer = {"choices": [{"message": {"content": "{}"}}], "usage": {"prompt_tokens": 3}}
        for raw in ["not json", json.dumps({"custom_id": "a", "response": {
                "status_code": 200, "body": answer}})] * 1000:  # fmt: skip
            read += 1
            yield raw

    try:
        results = api.parse_lines(lines())
        bad = await anext(results)
        assert bad.custom_id is None and bad.malformed and read == 1
        good = await anext(results)
        assert good.custom_id == "a" and good.usage.input_tokens == 3 and read == 2
        await results.aclose()
    finally:
        await api.aclose()


async def test_find_reads_a_bounded_number_of_pages(sim, monkeypatch):
    from herd.llm.providers import openai_batch
    from herd.llm.providers.batch import Request

    monkeypatch.setattr(openai_batch, "PAGE", 1)
    monkeypatch.setattr(openai_batch, "MAX_PAGES", 2)
    api = openai_batch.OpenAIBatch(sim.openai_url, SECRET, model="sim-1")
    try:
        for _ in range(3):
            handle = batchapi.new_handle()
            file_id = await api.upload(handle, [Request("a" * 64, "s", "u", None, {})])
            await api.create(handle, file_id)
        with pytest.raises(ProviderError, match="after 2 pages"):
            await api.find(batchapi.new_handle())
    finally:
        await api.aclose()


async def test_an_anthropic_batch_made_before_ids_carried_whole_keys_is_still_filed(
    app, sim, tmp_path, anthropic_env, monkeypatch
):
    from herd.llm.providers.anthropic_batch import AnthropicBatch

    # The ids the previous release sent: the handle's prefix and the key's first 43 hex.
    current = AnthropicBatch.custom_id
    monkeypatch.setattr(AnthropicBatch, "custom_id", lambda _s, h, k: f"{h[:20]}-{k[:43]}")
    await submit(app, [docs(tmp_path, 3)], ANTH_SPEC, batch="old", batch_api=True)
    rt = await evaluate.EvalRuntime.of(app)

    async def created() -> bool:
        rows = await rt.store.execute("SELECT state FROM herd_eval_provider_batches")
        return [s for (s,) in rows] == ["polling"]

    await work_until(app, created)  # the poll job waits POLL_FIRST seconds: not run yet
    monkeypatch.setattr(AnthropicBatch, "custom_id", current)  # the upgrade
    await work_until(app, lambda: all_done(app, 3))
    stats = sim.stats()
    assert stats["batch_billed"] == 3 and stats["billed"] == 0
    assert {src for _, src in await items(app)} == {"batch"}


async def test_anthropic_find_reads_a_bounded_number_of_pages(sim, anthropic_env, monkeypatch):
    from herd.llm.providers import anthropic_batch
    from herd.llm.providers.batch import Request

    monkeypatch.setattr(anthropic_batch, "PAGE", 1)
    monkeypatch.setattr(anthropic_batch, "MAX_PAGES", 2)
    sim.configure(batch_latency=0.05)
    api = anthropic_batch.AnthropicBatch(model="sim-1")
    try:
        mine = batchapi.new_handle()  # made before the others: none can be ruled out by time
        made = []
        for _ in range(3):
            other = batchapi.new_handle()
            marker = await api.upload(other, [Request("a" * 64, "s", "u", None, {})])
            made.append(await api.create(other, marker))

        async def ended() -> bool:
            return all([(await api.retrieve(b)).ended for b in made])

        await eventually(ended, timeout=10)
        with pytest.raises(ProviderError, match="more than 2 pages"):
            await api.find(mine)
    finally:
        await api.aclose()
