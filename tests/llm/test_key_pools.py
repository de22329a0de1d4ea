"""Key pools end to end: HERD_LIMITS names two keys of one provider, the workers call
the simulator (the openai wire format, a bucket per key) with whichever key has room,
a 429 pauses that key only, and the ledger names the key that paid, never the key.
Everything is asserted by counts (the ledger, the simulator, the limiter), never by
time."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from herd import App, JobStatus, console
from herd.limits import Limit, scope_name
from herd.limits.base import key_id, pooled
from herd.llm import eval as evaluate
from herd.llm.eval import EvalSpec, batchapi, enqueue_documents
from herd.llm.eval.plan import plan_items
from herd.llm.eval.submit import KEY_BYTES, PAYLOAD_SPARE, submit
from herd.llm.follow import print_status
from tests.api.conftest import client_of
from tests.conftest import truncate
from tests.helpers import eventually
from tests.llm.conftest import clean_eval_tables
from tests.llm.test_limits_eval import SCHEMA, docs, running
from tests.test_cli import herd

KEY_A = "sk-pool-A-SECRET-0001"
KEY_B = "sk-pool-B-SECRET-0002"
A, B = key_id(KEY_A), key_id(KEY_B)
PAID = ("call", "lost", "failed", "cut_short")


def pool_file(path: Path, model: str, rpm: int) -> Path:
    path.write_text(
        f'[[limits]]\nprovider = "openai"\nmodel = "{model}"\n'
        'key = ["env:HERD_POOL_KEY_A", "env:HERD_POOL_KEY_B"]\n'
        f"rpm = {rpm}\nperiod = 1.0\n"
    )
    return path


@pytest.fixture
def model() -> str:
    # A model of each test's own: limits (and pauses) are kept per provider, model, key.
    return f"sim-pool-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def pool_env(pg_url, sim, monkeypatch, tmp_path, model):
    monkeypatch.setenv("HERD_LIMITS", str(pool_file(tmp_path / "limits.toml", model, 8)))
    monkeypatch.setenv("HERD_POOL_KEY_A", KEY_A)
    monkeypatch.setenv("HERD_POOL_KEY_B", KEY_B)
    monkeypatch.setenv("OPENAI_BASE_URL", sim.openai_url)
    # The process's own key is none of the pool's: a call that went out with it shows.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-in-the-pool-9999")
    truncate(pg_url)
    clean_eval_tables(pg_url)
    return pg_url


@contextlib.asynccontextmanager
async def worker_app(url: str) -> AsyncIterator[App]:
    """An app of its own (its own limiter and gates, as a worker on another machine
    has), with leases long enough for a loaded machine: a lease lost mid-call pays the
    call again, and the counts below would be the load's."""
    app = App(database_url=url)
    app.task(name=evaluate.TASK, queue=evaluate.QUEUE, lease_seconds=60.0, max_attempts=1)(
        evaluate.task.evaluate
    )
    async with app:
        yield app


def spec(model: str) -> EvalSpec:
    return EvalSpec(model=model, system="Rate it.", schema=SCHEMA, params={"max_tokens": 40})


def ledger(url: str, batch: str) -> list[dict[str, Any]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT row_to_json(l)::text FROM herd_eval_ledger l WHERE batch = %s", (batch,)
        ).fetchall()
    return [json.loads(r[0]) for r in rows]


async def finished(app, batch: str, n: int) -> dict[str, Any] | None:  # type: ignore[no-untyped-def]
    status = (await evaluate.batch_status(app, batch)).to_json()
    return status if status["done"] + status["failed"] >= n else None


async def test_a_pool_of_two_keys_drains_on_both_without_a_429(pool_env, sim, model):
    # Each key's bucket at the provider holds 16 calls (its refill over the test is a
    # fraction of one): 24 calls fit in two keys' buckets, and never in one.
    sim.configure(keys={KEY_A: {"rpm": 16}, KEY_B: {"rpm": 16}})
    async with worker_app(pool_env) as a, worker_app(pool_env) as b:
        await enqueue_documents(a, spec(model), "pool", docs(24, "p"))
        async with running(a, 4), running(b, 4):
            status = await eventually(lambda: finished(a, "pool", 24), timeout=60, interval=0.1)
        assert status["done"] == 24 and status["failed"] == 0
        stats = sim.stats()
        assert stats["rate_limited"] == 0 and stats["billed"] == 24
        by_key = stats["by_key"]
        assert set(by_key) == {A, B}, by_key  # the process's own key never went out
        assert by_key[A]["billed"] + by_key[B]["billed"] == 24
        assert by_key[A]["billed"] <= 16 and by_key[B]["billed"] <= 16
        # The ledger names the key that paid each call, as the provider counted them.
        rows = ledger(pool_env, "pool")
        paid = [r["key_id"] for r in rows if r["kind"] in PAID]
        assert {k: paid.count(k) for k in (A, B)} == {
            A: by_key[A]["billed"], B: by_key[B]["billed"]
        }  # fmt: skip
        text = json.dumps(rows)
        assert KEY_A not in text and KEY_B not in text
        # Each key's own limit counted its own calls.
        rt = await evaluate.EvalRuntime.of(a)
        assert rt.limiter is not None
        scopes = [scope_name("openai", model, k) for k in (A, B)]
        counted = {s.scope: s.requests for s in await rt.limiter.stats(scopes)}
        assert counted == {scopes[0]: by_key[A]["billed"], scopes[1]: by_key[B]["billed"]}
        # `herd eval status` and GET /evals/{batch}: the keys by their variables.
        found = await evaluate.batch_status(a, "pool")
        keys = {u["key"]: u["requests"] for u in found.to_json()["limit_usage"]}
        assert keys == {"HERD_POOL_KEY_A": counted[scopes[0]],
                        "HERD_POOL_KEY_B": counted[scopes[1]]}  # fmt: skip
        # What each key paid, from the ledger's summary: the provider's count per key.
        assert found.to_json()["keys"] == [
            {"key": v, "key_id": k, "calls": by_key[k]["billed"], "cost": None}
            for v, k in sorted([("HERD_POOL_KEY_A", A), ("HERD_POOL_KEY_B", B)],
                               key=lambda p: p[1])
        ]  # fmt: skip
        with console.out.capture() as shown:
            print_status(found)
        out = shown.get()
        assert "paid by key" in out
        # GET /evals/{batch}: the same keys, by their variables, and never a key.
        async with client_of(a) as client:
            r = await client.get("/evals/pool")
        assert r.status_code == 200, r.text
        assert [k["key"] for k in r.json()["keys"]] == [k["key"] for k in found.keys]
        assert {u["key"] for u in r.json()["limit_usage"]} == set(keys)
        assert KEY_A not in r.text and KEY_B not in r.text
        assert all(len(line) <= 80 for line in out.splitlines() if "KEY" in line)
        assert out.count(f"openai:{model}") == 3  # two limit rows, one shares table
        assert "key HERD_POOL_KEY_A" in out and "key HERD_POOL_KEY_B" in out
        assert KEY_A not in out and KEY_B not in out


async def test_a_429_on_one_key_pauses_that_key_only(pool_env, sim, model):
    # Key A's bucket at the provider holds one call a minute; B's plenty. herd's limits
    # say 8 a second each: the provider's 429 is what tells herd about A.
    sim.configure(keys={KEY_A: {"rpm": 1}, KEY_B: {"rpm": 1000}})
    async with worker_app(pool_env) as app:
        await enqueue_documents(app, spec(model), "one429", docs(10, "q"))
        async with running(app, 2):
            status = await eventually(lambda: finished(app, "one429", 10), timeout=60,
                                      interval=0.1)  # fmt: skip
        assert status["done"] == 10 and status["failed"] == 0
        by_key = sim.stats()["by_key"]
        # A paid its one call; its 429s (the calls in flight when the first came back, at
        # most the worker's concurrency) paused it, and it was not tried again.
        assert by_key[A]["billed"] == 1 and 1 <= by_key[A]["rate_limited"] <= 2
        assert by_key[B]["billed"] == 9 and by_key[B]["rate_limited"] == 0
        rt = await evaluate.EvalRuntime.of(app)
        assert rt.limiter is not None
        sa, sb = (scope_name("openai", model, k) for k in (A, B))
        stats = {s.scope: s for s in await rt.limiter.stats([sa, sb])}
        assert stats[sa].paused_until is not None and stats[sa].rate_limited >= 1
        assert stats[sb].paused_until is None and stats[sb].rate_limited == 0
        # Handed to the other key, not back to the queue: no attempt counted.
        jobs = await app.broker.list_jobs(status=JobStatus.SUCCEEDED)
        assert len(jobs) == 10 and all(j.attempts == 0 for j in jobs)
        paid = [r["key_id"] for r in ledger(pool_env, "one429") if r["kind"] in PAID]
        assert sorted(paid) == sorted([A] + [B] * 9)


async def test_a_key_the_provider_refuses_is_passed_over_for_the_rest_of_the_pool(
    pool_env, sim, model
):
    # The provider refuses A with a 401 (a revoked key). The batch finishes on B, nothing
    # is paid on A, no attempt is counted, and the fleet passes A over.
    sim.configure(keys={KEY_A: {"refused": True}, KEY_B: {"rpm": 1000}})
    async with worker_app(pool_env) as app:
        await enqueue_documents(app, spec(model), "onebad", docs(10, "r"))
        async with running(app, 2):
            status = await eventually(lambda: finished(app, "onebad", 10), timeout=60,
                                      interval=0.1)  # fmt: skip
        assert status["done"] == 10 and status["failed"] == 0 and status["parked"] is None
        stats = sim.stats()
        assert stats["billed"] == 10 and stats["by_key"][B]["billed"] == 10, stats["by_key"]
        assert stats["by_key"].get(A, {}).get("billed", 0) == 0
        jobs = await app.broker.list_jobs(status=JobStatus.SUCCEEDED)
        assert len(jobs) == 10 and all(j.attempts == 0 for j in jobs)
        rows = ledger(pool_env, "onebad")
        assert [r["key_id"] for r in rows if r["kind"] in PAID] == [B] * 10
        rt = await evaluate.EvalRuntime.of(app)
        assert rt.limiter is not None
        (a_stats,) = await rt.limiter.stats([scope_name("openai", model, A)])
        assert a_stats.paused_until is not None
        assert a_stats.rate_limited == 0  # a wrong key is no 429 of the provider
        # `herd eval status` at 80 columns: the pause on a line of its own under its key.
        with console.out.capture() as shown:
            print_status(await evaluate.batch_status(app, "onebad"))
        lines = shown.get().splitlines()
        at = next(n for n, line in enumerate(lines) if "key HERD_POOL_KEY_A" in line)
        assert lines[at + 1].split()[:1] == ["paused"] and lines[at + 1].rstrip().endswith(" s")
        assert all(len(line) <= 80 for line in lines if "key" in line or "paused" in line), lines


async def test_a_pool_whose_every_key_is_refused_parks_its_batch_naming_them(pool_env, sim, model):
    sim.configure(keys={KEY_A: {"refused": True}, KEY_B: {"refused": True}})
    async with worker_app(pool_env) as app:
        await enqueue_documents(app, spec(model), "allbad", docs(3, "s"))

        async def parked():
            found = await evaluate.batch_status(app, "allbad")
            return found if found.parked else None

        async with running(app, 1):
            found = await eventually(parked, timeout=60, interval=0.1)
        assert found.parked == "refused"
        reason = found.parked_reason or ""
        assert f"every key of the pool was refused ({', '.join(sorted([A, B]))})" in reason
        assert KEY_A not in reason and KEY_B not in reason
        assert sim.stats()["billed"] == 0


async def test_the_api_refuses_a_batch_whose_pool_key_is_not_set(pool_env, sim, model,
                                                                 monkeypatch):  # fmt: skip
    monkeypatch.delenv("HERD_POOL_KEY_B")
    body = {"model": model, "system": "Rate it.", "batch": "api-unset",
            "documents": [{"name": "d", "text": "One document."}]}  # fmt: skip
    async with worker_app(pool_env) as app, client_of(app) as client:
        r = await client.post("/evals", json=body)
    assert r.status_code == 422, r.text
    assert "HERD_POOL_KEY_B is not set" in r.text and KEY_A not in r.text
    assert sim.stats()["calls"] == 0


def test_a_pool_key_that_is_not_set_is_refused_at_submit(pool_env, sim, tmp_path, model):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "d.txt").write_text("One document.")
    (tmp_path / "prompt.txt").write_text("Rate it.")
    env = {"HERD_LIMITS": str(pool_file(tmp_path / "pool.toml", model, 8)),
           "HERD_POOL_KEY_A": KEY_A, "OPENAI_BASE_URL": sim.openai_url}  # fmt: skip
    r = herd("eval", "submit", str(tmp_path / "docs"), "--prompt", str(tmp_path / "prompt.txt"),
             "--model", model, "--batch", "unset", url=pool_env, **env)  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "key[1]: HERD_POOL_KEY_B is not set" in r.stderr and KEY_A not in r.stderr
    with psycopg.connect(pool_env) as conn:
        (items,) = conn.execute("SELECT count(*) FROM herd_eval_items").fetchone() or (0,)
        (jobs,) = conn.execute("SELECT count(*) FROM herd_jobs").fetchone() or (0,)
    assert items == 0 and jobs == 0 and sim.stats()["calls"] == 0
    # The same file with both keys set is accepted.
    ok = herd("eval", "submit", str(tmp_path / "docs"), "--prompt", str(tmp_path / "prompt.txt"),
              "--model", model, "--batch", "set", url=pool_env,
              **env, HERD_POOL_KEY_B=KEY_B)  # fmt: skip
    assert ok.returncode == 0, ok.stderr


async def test_a_plan_counts_the_time_at_the_pools_limits_added_up(pool_env, sim, model):
    async with worker_app(pool_env) as app:
        plan = await plan_items(app, spec(model), docs(24, "t"))
    # Two keys of 8 a second each: 24 calls take 1.5 s, not one key's 3 s.
    assert plan.limits == {"rpm": 16, "period": 1.0} and plan.binds == "rpm"
    assert plan.minutes == pytest.approx(24 / 16 / 60)
    assert sim.stats()["calls"] == 0


def test_pooled_limits_add_up_per_the_first_period():
    assert pooled([Limit(rpm=600, tpm=1000), Limit(rpm=10, tpm=10, period=1.0)]) == Limit(
        rpm=1200, tpm=1600, period=60.0
    )
    # A key without a tpm leaves the pool's tokens unlimited.
    assert pooled([Limit(rpm=5, tpm=9), Limit(rpm=5, max_concurrent=2)]) == Limit(rpm=10)


async def test_a_pools_keys_make_the_provider_batches_each_reached_with_its_own_key(
    pool_env, sim, monkeypatch, tmp_path
):
    """--batch-api with a pool: each chunk's provider batch is made with a key of the
    pool (the provider's own variable unset, as a pool allows), recorded with its handle,
    and polled, read and paid with that key: the simulator, like the providers, keeps a
    key's batches where another key cannot reach them. The Batch API went out with no key
    at all before."""
    monkeypatch.delenv("OPENAI_API_KEY")
    # Two requests a chunk: 12 documents make 6 provider batches.
    monkeypatch.setenv("HERD_MAX_PAYLOAD_BYTES", str(PAYLOAD_SPARE + 2 * KEY_BYTES))
    sim.configure(batch_latency=0.2)
    model = f"sim-pool-batches-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("HERD_LIMITS", str(pool_file(tmp_path / "limits.toml", model, 600)))
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(12):
        (folder / f"d{i}.txt").write_text(f"Document {i}: it reports what it measured.\n")
    app = App(database_url=pool_env)
    app.task(name=evaluate.TASK, queue=evaluate.QUEUE, lease_seconds=60.0)(evaluate.task.evaluate)
    app.task(name=evaluate.spec.SUBMIT_TASK, queue=evaluate.QUEUE)(batchapi.batch_submit)
    app.task(name=evaluate.spec.POLL_TASK, queue=evaluate.QUEUE)(batchapi.batch_poll)
    async with app:
        await submit(app, [folder], spec(model), batch="pooled", batch_api=True)
        async with running(app, 4):
            status = await eventually(lambda: finished(app, "pooled", 12), timeout=60,
                                      interval=0.1)  # fmt: skip
    assert status["done"] == 12 and status["failed"] == 0
    stats = sim.stats()
    assert stats["billed"] == 0 and stats["batch_billed"] == 12  # all through the Batch API
    made = stats["batches"]["created_by_key"]
    # Both keys, no other: each chunk goes to the key with the fewest batches open.
    assert set(made) == {A, B} and sum(made.values()) == 6, made
    with psycopg.connect(pool_env) as conn:
        handles = dict(conn.execute(
            "SELECT key_variable, count(*) FROM herd_eval_provider_batches WHERE batch = %s"
            " GROUP BY 1", ("pooled",)
        ).fetchall())  # fmt: skip
    assert handles == {"HERD_POOL_KEY_A": made[A], "HERD_POOL_KEY_B": made[B]}
    # Each billed line names the key that paid: its provider batch's.
    paid = [r["key_id"] for r in ledger(pool_env, "pooled") if r["kind"] in PAID]
    assert {k: paid.count(k) for k in set(paid)} == {A: 2 * made[A], B: 2 * made[B]}
    assert KEY_A not in json.dumps(ledger(pool_env, "pooled"))
