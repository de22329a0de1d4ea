"""Evaluations under fleet-wide provider limits: the limit holds across workers, a 429
one worker gets pauses all of them, and a job that cannot get capacity in time is
handed back with no attempt counted."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from herd import App, JobStatus, Worker, console
from herd.api import metrics, overview
from herd.limits import batch_scope, scope_name
from herd.limits.base import key_id
from herd.llm import eval as evaluate
from herd.llm.eval import EvalSpec, enqueue_documents
from herd.llm.follow import print_status as _print_status
from tests.conftest import flush_redis, truncate
from tests.helpers import eventually
from tests.llm.conftest import clean_eval_tables

KEY = "sk-limits-SECRET"
SCHEMA = {
    "type": "object",
    "properties": {"score": {"type": "integer"}, "summary": {"type": "string"}},
    "required": ["score", "summary"],
}


def spec(model: str) -> EvalSpec:
    # A model of each test's own: limits are kept per provider, model and key.
    return EvalSpec(model=model, system="Rate it.", schema=SCHEMA, params={"max_tokens": 60})


def docs(n: int, tag: str) -> list[tuple[str, str]]:
    return [
        (f"{tag}{i}.txt", f"Document {tag} {i}: it reports what it measured.") for i in range(n)
    ]


@pytest.fixture
def limited_env(pg_url, sim, monkeypatch, tmp_path):
    limits = tmp_path / "limits.toml"
    limits.write_text(
        '[[limits]]\nprovider = "openai"\nmodel = "sim-rate"\nrpm = 4\ntpm = 100000\n'
        "period = 1.0\n\n"
        '[[limits]]\nprovider = "openai"\nmodel = "sim-429"\nrpm = 1000\n\n'
        '[[limits]]\nprovider = "openai"\nmodel = "sim-tiny"\ntpm = 50\n'
    )
    monkeypatch.setenv("HERD_LIMITS", str(limits))
    monkeypatch.setenv("HERD_LIMIT_MAX_WAIT", "1")
    monkeypatch.setenv("OPENAI_BASE_URL", sim.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    truncate(pg_url)
    clean_eval_tables(pg_url)
    return pg_url


@contextlib.asynccontextmanager
async def worker_app(url: str) -> AsyncIterator[App]:
    """An app of its own: its own limiter and gates, as a worker on another machine has."""
    app = App(database_url=url)
    app.task(name=evaluate.TASK, queue=evaluate.QUEUE, lease_seconds=5.0, max_attempts=1)(
        evaluate.task.evaluate
    )
    async with app:
        yield app


@contextlib.asynccontextmanager
async def running(app: App, concurrency: int) -> AsyncIterator[Worker]:
    worker = Worker(app, queues=[evaluate.QUEUE], concurrency=concurrency, poll_interval=0.05,
                    install_signal_handlers=False)  # fmt: skip
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)


async def test_two_workers_share_one_limit_and_the_provider_never_refuses(limited_env, sim):
    async with worker_app(limited_env) as a, worker_app(limited_env) as b:
        await enqueue_documents(a, spec("sim-rate"), "rate", docs(12, "r"))
        started = time.monotonic()
        async with running(a, 4), running(b, 4):
            status = await eventually(lambda: _done(a, "rate", 12), timeout=20, interval=0.1)
        elapsed = time.monotonic() - started
        stats = sim.stats()
        assert status["failed"] == 0 and stats["billed"] == 12 and stats["rate_limited"] == 0
        # 4 a second with a burst of a fifth of a request, for 8 concurrent callers in two
        # processes: 12 calls take at least 11 intervals of 1/3.8 s.
        assert elapsed >= 11 / 3.8 - 0.2
        rt = await evaluate.EvalRuntime.of(a)
        assert rt.limiter is not None
        (limit,) = await rt.limiter.stats([scope_name("openai", "sim-rate", key_id(KEY))])
        assert limit.requests == 12 and limit.waits >= 1 and limit.rate_limited == 0
        # Reconciled with what the provider counts: its input tokens plus max_tokens.
        billed = stats["billed_tokens"]["input"] + 12 * 60
        assert limit.tokens == billed
        jobs = await a.broker.list_jobs(status=JobStatus.SUCCEEDED)
        assert len(jobs) == 12 and all(j.attempts == 0 for j in jobs)
        # Seen in `herd eval status`: the batch's limit, its use and its waits.
        found = await evaluate.batch_status(a, "rate")
        status = found.to_json()
        (usage,) = status["limit_usage"]
        assert usage["limit"]["rpm"] == 4 and usage["requests"] == 12 and usage["waits"] >= 1
        with console.out.capture() as shown:
            _print_status(found)
        assert "provider limits (fleet-wide)" in shown.get()
        assert "/4 " in shown.get() and KEY not in shown.get()  # use / limit, never the key


async def test_a_429_one_worker_gets_pauses_every_worker_and_costs_no_attempt(limited_env, sim):
    # The provider allows 2 calls a minute, herd's limit far more: the provider's 429
    # is what tells the fleet.
    sim.configure(rpm=2)
    async with worker_app(limited_env) as a, worker_app(limited_env) as b:
        await enqueue_documents(a, spec("sim-429"), "first", docs(3, "f"))
        async with running(a, 1):
            await sim.wait_for(lambda s: s["rate_limited"] >= 1, timeout=10)

            async def snoozed() -> bool:
                jobs = await a.broker.list_jobs(status=JobStatus.PENDING)
                return len(jobs) == 1 and jobs[0].attempts == 0

            await eventually(snoozed, timeout=10)
        before = sim.stats()
        assert before["billed"] == 2 and before["rate_limited"] == 1

        # Another worker, with limiter state of its own, sends nothing while it lasts.
        await enqueue_documents(b, spec("sim-429"), "second", docs(3, "s"))
        async with running(b, 3):

            async def all_handed_back() -> bool:
                jobs = await b.broker.list_jobs(status=JobStatus.PENDING)
                return len(jobs) == 4 and all(j.attempts == 0 for j in jobs)

            await eventually(all_handed_back, timeout=10)
        after = sim.stats()
        assert after["calls"] == before["calls"] and after["rate_limited"] == 1
        assert await b.broker.list_jobs(status=JobStatus.DEAD) == []
        rt = await evaluate.EvalRuntime.of(b)
        assert rt.limiter is not None
        (limit,) = await rt.limiter.stats([scope_name("openai", "sim-429", key_id(KEY))])
        assert limit.rate_limited == 1 and limit.paused_until is not None
        # Seen on the dashboard's overview and in /metrics.
        (shown,) = [r for r in await overview.limits(b) if r.scope == limit.scope]
        assert shown.rate_limited == 1 and shown.paused_for > 0
        collector = metrics.HerdCollector()
        collector.reading = await metrics.read(b)
        samples = {
            (m.name, s.labels.get("scope")): s.value for m in collector.collect() for s in m.samples
        }
        assert samples[("herd_limit_rate_limited", limit.scope)] == 1
        assert samples[("herd_limit_paused_seconds", limit.scope)] > 0


async def test_a_call_larger_than_its_token_limit_is_dead_lettered_at_once_unsent(limited_env, sim):
    async with worker_app(limited_env) as a:
        await enqueue_documents(a, spec("sim-tiny"), "tiny", docs(1, "t"))
        async with running(a, 1):

            async def dead() -> list[object]:
                return list(await a.broker.list_jobs(status=JobStatus.DEAD))

            (job,) = await eventually(dead, timeout=10)
        assert job.dead_reason == "fatal" and "can never pass the limit of 50 tokens" in str(
            job.last_error
        )
        assert sim.stats()["calls"] == 0


async def _done(app: App, batch: str, n: int) -> dict[str, object] | None:
    status = (await evaluate.batch_status(app, batch)).to_json()
    return status if status["done"] + status["failed"] == n else None


@pytest.fixture(params=["postgres", "redis"])
def shared_key_env(request, pg_url, sim, monkeypatch, tmp_path):
    """HERD_LIMITS of 600 rpm for a model of this test's own, the jobs (and so the
    limiter) on each backend."""
    model = f"sim-share-{uuid.uuid4().hex[:8]}"  # limiter scopes outlive a test
    limits = tmp_path / "limits.toml"
    limits.write_text(f'[[limits]]\nprovider = "openai"\nmodel = "{model}"\nrpm = 600\n')
    monkeypatch.setenv("HERD_LIMITS", str(limits))
    monkeypatch.setenv("HERD_LIMIT_MAX_WAIT", "1")
    monkeypatch.setenv("OPENAI_BASE_URL", sim.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    if request.param == "redis":
        redis_url = request.getfixturevalue("redis_stack")
        flush_redis(redis_url)
        monkeypatch.setenv("HERD_BROKER", "redis")
        monkeypatch.setenv("HERD_REDIS_URL", redis_url)
    truncate(pg_url)
    clean_eval_tables(pg_url)
    return pg_url, model


async def test_a_batch_limit_is_a_scope_of_its_own_and_slows_no_other_batch(shared_key_env, sim):
    url, model = shared_key_env
    async with worker_app(url) as a:
        # Another client's batch limited to 1 request a minute: its first call passes,
        # its second waits a minute.
        await enqueue_documents(a, spec(model), "slow", docs(2, "s"), limits={"rpm": 1})
        async with running(a, 2):
            await sim.wait_for(lambda s: s["billed"] >= 1, timeout=10)
            # The same provider, model and key, no limit of its own: only the fleet's
            # 600 a minute applies (30 requests of burst), so its 10 calls pass at once.
            await enqueue_documents(a, spec(model), "fast", docs(10, "f"))
            status = await eventually(lambda: _done(a, "fast", 10), timeout=15, interval=0.1)
        assert status["failed"] == 0
        slow = (await evaluate.batch_status(a, "slow")).to_json()
        assert slow["done"] == 1  # its own limit still holds it back
        rt = await evaluate.EvalRuntime.of(a)
        assert rt.limiter is not None
        fleet = scope_name("openai", model, key_id(KEY))
        own = batch_scope("slow", "openai", model)
        found = {s.scope: s for s in await rt.limiter.stats([fleet, own])}
        # The fleet's scope keeps HERD_LIMITS's limit, whoever called last; the batch's
        # rpm 1 is kept, and counted, under its own scope.
        assert found[fleet].limit.rpm == 600 and found[fleet].requests == 11
        assert found[own].limit.rpm == 1 and found[own].requests == 1
        (shown,) = [r for r in await overview.limits(a) if r.scope == fleet]
        assert shown.rpm == 600
        # `herd eval status` of the slow batch shows its own limit beside the fleet's.
        usage = {u["scope"]: u for u in slow["limit_usage"]}
        assert usage[own]["limit"]["rpm"] == 1 and usage[fleet]["limit"]["rpm"] == 600
