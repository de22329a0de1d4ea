"""The connection budget of docs/connections.md holds: a real Worker at concurrency N, with
the evaluation runtime's ledger, exact cache and locks in use, never holds more
PostgreSQL connections (pg_stat_activity, by application_name ``herd:<pid>``) or
Redis connections (CLIENT LIST, by name) than documented."""

from __future__ import annotations

import asyncio
import os

import psycopg
import pytest
import redis

from herd import App
from herd.config import PG_POOL_SPARE, Settings
from herd.llm.eval import EvalRuntime
from herd.worker import Worker

N = 6


def budget(kind: str, concurrency: int) -> tuple[int, int]:
    """(PostgreSQL, Redis) connections of a worker, as docs/connections.md's table says."""
    pool = concurrency + PG_POOL_SPARE
    if kind == "postgres":
        # The pool, one LISTEN connection for jobs and locks, the liveness mark's session.
        return pool + 2, 0
    # Jobs, cache and locks on Redis (and the liveness mark's connection); the
    # evaluation ledger stays in PostgreSQL.
    return 4, pool + 1


@pytest.mark.parametrize("kind", ["postgres", "redis"])
async def test_a_worker_holds_no_more_connections_than_its_budget(kind, clean_pg, redis_stack):
    redis.Redis.from_url(redis_stack).flushdb()
    settings = Settings(
        database_url=clean_pg, redis_url=redis_stack, broker=kind, cache=kind, home=Settings().home
    )
    app = App(settings=settings)

    @app.task(name="budget.work", lease_seconds=10)
    async def work(payload: dict[str, int]) -> object:
        runtime = await EvalRuntime.of(app)

        async def compute() -> object:
            await asyncio.sleep(0.02)
            return payload["key"]

        # Shared keys: jobs wait on one another's locks (singleflight) and notifications.
        lookup = await runtime.cache.get_or_compute(f"k{payload['key']}", compute)
        kind = "cache" if lookup.source == "hit" else "call"
        await runtime.store.record(batch=None, job_id=None, key="k", kind=kind, cost=0.0)
        return lookup.value

    name = f"herd:{os.getpid()}"
    mine = f":{os.getpid()}:"  # in this process's worker ids, so in its liveness marks' names
    peak = {"pg": 0, "redis": 0}
    probe_pg = psycopg.connect(clean_pg, autocommit=True)
    probe_redis = redis.Redis.from_url(redis_stack)
    stop = asyncio.Event()
    base = {"pg": 0, "redis": 0}

    def count() -> tuple[int, int]:
        (pg,) = probe_pg.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
        ).fetchone() or (0,)
        rd = sum(
            1
            for c in probe_redis.client_list()
            if c.get("name") == name
            or (c.get("name", "").startswith("herd-live:") and mine in c["name"])
        )
        return int(pg), rd

    def sample() -> None:
        pg, rd = count()
        peak["pg"] = max(peak["pg"], pg - base["pg"])
        peak["redis"] = max(peak["redis"], rd - base["redis"])

    async def sampler() -> None:
        while not stop.is_set():
            await asyncio.to_thread(sample)

    # Pools other tests of this process left open are not this worker's.
    base["pg"], base["redis"] = count()
    worker = Worker(
        app, concurrency=N, poll_interval=0.05, install_signal_handlers=False, stop_when_idle=True
    )
    async with app:
        await app.enqueue_many("budget.work", [{"key": i % 7} for i in range(120)])
        watching = asyncio.create_task(sampler())
        stats = await asyncio.wait_for(worker.run(), 60)
        stop.set()
        await watching
    probe_pg.close()
    probe_redis.close()
    assert stats.succeeded == 120
    most_pg, most_redis = budget(kind, N)
    assert 0 < peak["pg"] <= most_pg, peak
    assert peak["redis"] <= most_redis, peak
    if kind == "redis":
        assert peak["redis"] > 0, peak
