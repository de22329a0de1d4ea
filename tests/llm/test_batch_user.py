"""The evaluation batch from the user's chair: checks before anything is paid, a batch
that parks on a refused key, --wait following its own batch, results one row per
document, and the hardening of what a batch reads (issues 28 and 29)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import time
from pathlib import Path

import pytest

from herd import App, Worker
from herd.errors import InvalidInput
from herd.llm import eval as evaluate
from herd.llm.eval import EvalSpec, enqueue_documents, submit
from herd.llm.eval.spec import validate_answer
from tests.conftest import truncate
from tests.helpers import priced
from tests.llm.conftest import clean_eval_tables, run_until
from tests.test_cli import herd

SCHEMA = {
    "type": "object",
    "properties": {"score": {"type": "integer"}, "summary": {"type": "string"}},
    "required": ["score", "summary"],
}
SPEC = EvalSpec(model="sim-1", system="Rate the paper from 1 to 10.", schema=SCHEMA)
KEY = "sk-test-RIGHT"


@pytest.fixture
async def app(pg_url, sim, monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_BASE_URL", sim.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    priced(monkeypatch, tmp_path, "sim-1")
    truncate(pg_url)
    clean_eval_tables(pg_url)
    the_app = App(database_url=pg_url)
    the_app.task(name=evaluate.TASK, queue=evaluate.QUEUE, lease_seconds=5.0)(
        evaluate.task.evaluate
    )
    async with the_app:
        yield the_app


def folder(tmp: Path, n: int) -> Path:
    docs = tmp / "docs"
    docs.mkdir(exist_ok=True)
    for i in range(n):
        (docs / f"p{i}.txt").write_text(f"Paper {i}.\nIt has results number {i}.\n")
    return docs


async def parked(app: App, batch: str):  # type: ignore[no-untyped-def]
    async def probe():  # type: ignore[no-untyped-def]
        found = await evaluate.batch_status(app, batch)
        return found if found.parked and not found.queued and not found.running else None

    return await run_until(app, probe)


async def drain(app: App, concurrency: int = 1) -> None:
    await Worker(app, queues=[evaluate.QUEUE], concurrency=concurrency, poll_interval=0.05,
                 stop_when_idle=True, install_signal_handlers=False).run()  # fmt: skip


# -- checks before anything is paid ------------------------------------------------


def test_an_invalid_schema_is_refused_where_the_spec_is_made():
    with pytest.raises(InvalidInput, match="not a valid JSON Schema"):
        EvalSpec(model="m", system="s", schema={"type": "objekt"})


def test_a_pattern_re2_cannot_match_in_linear_time_is_refused():
    with pytest.raises(InvalidInput, match="RE2"):
        EvalSpec(model="m", system="s", schema={"properties": {"x": {"pattern": r"(a)\1"}}})


def test_a_catastrophic_pattern_is_matched_in_linear_time():
    schema = {"type": "object", "properties": {"echo": {"type": "string", "pattern": "^(a+)+$"}}}
    answer = json.dumps({"echo": "a" * 5000 + "!"})
    started = time.monotonic()
    value, error = validate_answer(answer, schema)
    # Python's re takes seconds at 30 characters and doubles with each two more: at 5,000
    # it would not end. A bound on a loaded machine, not a speed.
    assert time.monotonic() - started < 10
    assert error is not None and "does not match" in error


def test_an_answer_past_the_bound_is_refused_before_it_is_parsed():
    value, error = validate_answer("[" * 2_000_000, None)
    assert error is not None and "longer than" in error


async def test_a_missing_path_is_refused_before_a_batch_is_made(app, tmp_path):
    with pytest.raises(InvalidInput, match="nothere"):
        await submit(app, [folder(tmp_path, 1), tmp_path / "nothere"], SPEC, batch="m")
    assert await app.list_jobs() == []
    assert await evaluate.list_batches(app) == []


async def test_a_missing_key_is_refused_before_anything_is_enqueued(app, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    spec = EvalSpec(model="claude-x", system="s", provider="anthropic")
    with pytest.raises(InvalidInput, match="ANTHROPIC_API_KEY is not set"):
        await enqueue_documents(app, spec, "k", [("a", "A paper.")])
    monkeypatch.delenv("OPENAI_BASE_URL")  # OpenAI's own API needs a key
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(InvalidInput, match="OPENAI_API_KEY is not set"):
        await enqueue_documents(app, SPEC, "k", [("a", "A paper.")])
    assert await app.list_jobs() == []


def test_the_cli_refuses_each_mistake_in_one_line_with_exit_2(tmp_path):
    docs = folder(tmp_path, 1)
    (tmp_path / "p.txt").write_text("Rate it.")
    (tmp_path / "bad.json").write_text('{"type": "objekt"}')
    base = ("eval", "submit", str(docs), "--prompt", str(tmp_path / "p.txt"), "--model", "m")
    url = "postgresql://herd@127.0.0.1:9/none"  # refused before any store is reached
    cases = [
        ((*base, "--schema", str(tmp_path / "bad.json")), {}, "not a valid JSON Schema"),
        ((*base, str(tmp_path / "nothere")), {}, "no such file"),
        ((*base, "--provider", "anthropic"), {"ANTHROPIC_API_KEY": ""}, "ANTHROPIC_API_KEY"),
        ((*base, "--provider", "acme"), {}, "not known"),
    ]
    for args, env, said in cases:
        r = herd(*args, url=url, COLUMNS="200", OPENAI_BASE_URL="http://127.0.0.1:9/v1", **env)
        assert r.returncode == 2, (args, r.stderr)
        assert said in r.stderr and "Traceback" not in r.stderr and r.stdout == "", r.stderr


# -- a refused key parks the batch ---------------------------------------------------


async def test_a_wrong_key_parks_the_batch_after_one_call_and_resume_continues(
    app, sim, tmp_path, monkeypatch
):
    sim.configure(api_key=KEY)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-WRONG")
    await submit(app, [folder(tmp_path, 6)], SPEC, batch="wrong")
    status = await parked(app, "wrong")
    assert status.parked == "refused" and "401" in (status.parked_reason or "")
    assert status.next == "herd eval resume wrong"
    assert sim.stats()["calls"] == 1  # one call for the whole batch, not three per document
    assert status.dead == 0 and status.parked_items == 6
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    (await evaluate.EvalRuntime.of(app)).providers.clear()  # the key is read by the client
    found = await evaluate.resume(app, "wrong")
    assert found["resumed"] >= 5
    await drain(app)
    status = await evaluate.batch_status(app, "wrong")
    assert status.done == 6 and status.parked is None


# -- following a batch ---------------------------------------------------------------


def cli_submit(tmp: Path, pg_url: str, sim, batch: str, *flags: str):  # type: ignore[no-untyped-def]
    (tmp / "p.txt").write_text("Rate the paper from 1 to 10.")
    (tmp / "schema.json").write_text(json.dumps(SCHEMA))
    (tmp / "prices.json").write_text(json.dumps({"sim-1": {"input": 1000.0, "output": 1000.0}}))
    return herd(
        "eval", "submit", str(tmp / "docs"), "--prompt", str(tmp / "p.txt"), "--model", "sim-1",
        "--schema", str(tmp / "schema.json"), "--batch", batch, *flags, url=pg_url,
        OPENAI_BASE_URL=sim.openai_url, OPENAI_API_KEY=KEY,
        HERD_PRICES=str(tmp / "prices.json"),
    )  # fmt: skip


async def test_wait_returns_at_once_when_its_batch_parks_naming_the_reason(
    app, sim, tmp_path, pg_url
):
    folder(tmp_path, 3)
    started = time.monotonic()
    r = cli_submit(tmp_path, pg_url, sim, "parks", "--wait", "--budget", "0.000001")
    assert time.monotonic() - started < 60  # a CLI process on a loaded machine: a bound
    assert r.returncode == 3, r.stderr
    assert "budget is spent" in r.stderr and "herd eval budget parks USD" in r.stderr
    assert sim.stats()["calls"] == 0


async def test_wait_follows_its_own_batch_past_another_that_is_parked(app, sim, tmp_path, pg_url):
    folder(tmp_path, 2)
    other = cli_submit(tmp_path, pg_url, sim, "other", "--budget", "0.000001")
    assert other.returncode == 0, other.stderr
    # It parks: its jobs wait in the queue for a budget.
    assert (await parked(app, "other")).parked == "budget"
    for p in (tmp_path / "docs").iterdir():
        p.write_text(p.read_text() + "Revised.\n")
    r = cli_submit(tmp_path, pg_url, sim, "mine", "--wait")
    assert r.returncode == 0, r.stderr
    assert "batch mine" in r.stdout and "2/2 answered" in r.stdout


async def test_results_give_one_row_per_document_dead_ones_included(app, sim, tmp_path, pg_url):
    sim.script("invalid", "invalid")  # the first document answers outside the schema twice
    await submit(app, [folder(tmp_path, 3)], SPEC, batch="res")
    await drain(app)
    status = await evaluate.batch_status(app, "res")
    assert (status.done, status.dead) == (2, 1) and status.failures[0]["path"].endswith(".txt")
    r = herd("eval", "results", "res", "--format", "csv", url=pg_url)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert len(rows) == 3
    assert {"path", "status", "model", "source", "cost", "score", "summary"} <= set(rows[0])
    dead = [row for row in rows if row["status"] == "dead"]
    assert len(dead) == 1 and "schema" in dead[0]["error"]
    done = [row for row in rows if row["status"] == "done"]
    assert all(row["source"] == "call" and row["score"] and int(row["input_tokens"]) > 0
               for row in done)  # fmt: skip
    unknown = herd("eval", "results", "nope", url=pg_url)
    assert unknown.returncode == 1 and "no batch named 'nope'" in unknown.stderr
    listed = herd("eval", "list", "--json", url=pg_url)
    (batch,) = [json.loads(x) for x in listed.stdout.splitlines()]
    # A dead document ends the batch too: it read "running" for good in the list.
    assert (batch["batch"], batch["state"], batch["failed"]) == ("res", "done", 1)
    table = herd("eval", "list", url=pg_url, COLUMNS="80").stdout
    assert "done, 1 failed" in table, table


# -- hardening -----------------------------------------------------------------------


async def test_an_item_is_never_settled_by_a_reused_job_id_of_another_key(app, sim, tmp_path):
    """After a job store loses data, ids start again: an item must not take the answer
    of the job that now carries its old id (issue 29, item 1)."""
    await submit(app, [folder(tmp_path, 1)], SPEC, batch="theirs")
    await drain(app)
    rt = await evaluate.EvalRuntime.of(app)
    ((job_id,),) = await rt.store.execute("SELECT job_id FROM herd_eval_items")
    # Batch A's item, written before the loss, names the same id with its own key.
    await rt.store.execute(
        "INSERT INTO herd_eval_items (batch, path, key, job_id) VALUES ('A', 'a.txt', %s, %s)",
        ("f" * 64, job_id),
    )
    status = await evaluate.batch_status(app, "A")
    assert status.done == 0 and status.lost == 1
    ((state,),) = await rt.store.execute("SELECT status FROM herd_eval_items WHERE batch = 'A'")
    assert state == "queued"


async def test_a_call_lost_mid_generation_is_charged_its_reservation(app, sim, tmp_path):
    """A call cut off after sending may have been billed for its whole output: the
    budget counts its worst case (issue 29, item 3)."""
    (r,) = await enqueue_documents(app, SPEC, "cut", [("a", "A paper.")])
    rt = await evaluate.EvalRuntime.of(app)
    async with rt.store.transaction() as conn:
        call = await evaluate.ledger.open_call(conn, {"batch": "cut", "job": r.job_id, "key": "k",
                                                      "model": "sim-1", "provider": "openai",
                                                      "i": 10, "w": 0.25})  # fmt: skip
    await rt.store.close_call(call, "lost", cost=0.0001)
    ((cost,),) = await rt.store.execute("SELECT cost::float8 FROM herd_eval_ledger WHERE id = %s",
                                        (call,))  # fmt: skip
    assert cost == 0.25


async def test_a_snooze_is_neither_a_cache_error_nor_a_miss(app, sim, tmp_path):
    await submit(app, [folder(tmp_path, 2)], SPEC, batch="snoozed")
    await evaluate.set_budget(app, "snoozed", 0.0)
    assert (await parked(app, "snoozed")).parked == "budget"
    stats = await (await evaluate.EvalRuntime.of(app)).cache.store.stats()
    assert stats.get("eval", {}).get("errors", 0) == 0
    assert stats.get("eval", {}).get("misses", 0) == 0


async def test_money_is_exact(app, tmp_path, monkeypatch):
    (r,) = await enqueue_documents(app, SPEC, "cents", [("a", "A paper.")])
    rt = await evaluate.EvalRuntime.of(app)
    for cost in (0.1, 0.2, 0.3):
        await rt.store.record(batch="cents", job_id=r.job_id, key=f"k{cost}", kind="call",
                              cost=cost)  # fmt: skip
    totals = await rt.store.totals("cents")
    assert totals["call"]["cost"] == 0.6  # not 0.6000000000000001


async def test_a_fast_worker_clock_does_not_date_a_batch_handle(app, sim, tmp_path, monkeypatch):
    """The handle's time, which bounds a takeover's search for its Anthropic batch, is the
    store's clock: a worker 15 minutes fast would otherwise make a takeover miss its batch
    and create a second, billed one (issue 29, item 10)."""
    from herd.llm.providers.anthropic_batch import handle_time

    real, real_ns = time.time, time.time_ns
    monkeypatch.setattr(time, "time", lambda: real() + 900)
    monkeypatch.setattr(time, "time_ns", lambda: real_ns() + 900 * 10**9)
    await submit(app, [folder(tmp_path, 2)], SPEC, batch="skew", batch_api=True)
    app.task(name=evaluate.spec.SUBMIT_TASK, queue=evaluate.QUEUE)(evaluate.batchapi.batch_submit)
    await drain(app)
    rt = await evaluate.EvalRuntime.of(app)
    ((handle, now),) = await rt.store.execute(
        "SELECT handle, extract(epoch FROM now())::float8 FROM herd_eval_provider_batches"
    )
    made = handle_time(handle)
    assert made is not None and abs(made - now) < 60


async def test_a_job_enqueued_by_the_old_code_drains_after_the_upgrade(app, sim):
    """The payload herd.llm.evaluate enqueued (batch, path, doc, spec, key: hashes only)
    is what the package's task reads: jobs queued before an upgrade finish after it."""
    rt = await evaluate.EvalRuntime.of(app)
    text = "An old paper.\nIt was queued before the upgrade."
    doc = hashlib.sha256(text.encode()).hexdigest()
    await rt.store.put_batch("old", budget=None, limits=None)
    await rt.store.put_spec(SPEC)
    await rt.store.put_documents({doc: text})
    key = SPEC.key(text)
    job = await app.enqueue(
        "herd.eval", {"batch": "old", "path": "old.txt", "doc": doc, "spec": SPEC.hash, "key": key},
        queue="eval", dedup_key=key,
    )  # fmt: skip
    await rt.store.put_items("old", SPEC.hash, [("old.txt", key, job.job_id, doc)])
    await drain(app)
    status = await evaluate.batch_status(app, "old")
    assert (status.documents, status.done) == (1, 1) and sim.stats()["calls"] == 1
