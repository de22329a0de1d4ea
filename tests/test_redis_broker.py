"""Redis-specific behaviour: persistence (AOF), connection drops, vanished lease keys."""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis

from herd import App, BrokerUnavailable, JobStatus, Worker
from herd.queue.redis import RedisBroker
from tests.conftest import CACHE, flush_redis
from tests.helpers import eventually
from tests.servers.redis_stack import RedisStackServer


def start(app: App, **kw) -> tuple[Worker, asyncio.Task]:
    worker = Worker(app, poll_interval=0.1, install_signal_handlers=False, **kw)
    return worker, asyncio.create_task(worker.run())


async def done(app: App, job_id: int) -> bool:
    try:
        return (await app.get_job(job_id)).status == JobStatus.SUCCEEDED
    except BrokerUnavailable:  # the probe's own connection was among those killed
        return False


@pytest.fixture
def aof_server(tmp_path):
    server = RedisStackServer(CACHE / "cache", tmp_path / "redis", appendonly=True,
                              appendfsync="always")  # fmt: skip
    server.start()
    yield server
    server.stop()


async def test_no_acknowledged_job_is_lost_when_redis_with_aof_is_killed(aof_server):
    app = App(broker=RedisBroker(aof_server.url))

    @app.task(name="double")
    async def double(payload):
        return payload * 2

    async with app:
        finished = await app.enqueue_many("double", list(range(10)))
        worker, run = start(app, concurrency=4, stop_when_idle=True)
        await run
        assert worker.stats.succeeded == 10
        waiting = await app.enqueue_many("double", list(range(10, 20)), dedup_keys=[
            f"k{i}" for i in range(10)])  # fmt: skip
    aof_server.kill()  # SIGKILL: no shutdown save
    aof_server.start()
    app = App(broker=RedisBroker(aof_server.url))
    app.tasks["double"] = double
    async with app:
        for r in finished:
            job = await app.get_job(r.job_id)
            assert job.status == JobStatus.SUCCEEDED and job.result == job.payload * 2
        # Still pending, still deduplicated, and they run after the restart.
        assert not (await app.enqueue("double", 99, dedup_key="k0")).created
        worker, run = start(app, concurrency=4, stop_when_idle=True)
        await run
        for r in waiting:
            job = await app.get_job(r.job_id)
            assert job.status == JobStatus.SUCCEEDED and job.result == job.payload * 2


async def test_missing_aof_is_warned_about_once(redis_stack, aof_server, caplog):
    caplog.set_level(logging.WARNING, logger="herd.redis")
    for url in (redis_stack, aof_server.url):
        broker = RedisBroker(url)
        await broker.open()
        await broker.open()
        await broker.close()
    warnings = [r.getMessage() for r in caplog.records if "AOF" in r.getMessage()]
    assert len(warnings) == 1 and redis_stack.rsplit(":", 1)[1].split("/")[0] in warnings[0]


@pytest.fixture
async def redis_app(redis_stack):
    flush_redis(redis_stack)
    app = App(broker=RedisBroker(redis_stack))
    async with app:
        yield app


async def test_worker_survives_its_connections_being_killed(redis_app, redis_stack):
    @redis_app.task(name="step")
    async def step(payload):
        await asyncio.sleep(0.05)
        return payload

    jobs = await redis_app.enqueue_many("step", list(range(40)))
    worker, run = start(redis_app, concurrency=4)
    await eventually(lambda: done(redis_app, jobs[5].job_id))
    admin = redis.Redis.from_url(redis_stack)
    killed = admin.client_kill_filter(_type="normal", skipme=True)
    admin.close()
    assert killed >= 1
    for r in jobs:
        await eventually(lambda r=r: done(redis_app, r.job_id), timeout=20)
    worker.stop()
    await run
    assert worker.stats.succeeded == 40


async def test_a_vanished_lease_key_is_recovered_by_reclaim(redis_app, redis_stack):
    started = asyncio.Event()
    runs = []

    @redis_app.task(name="slow", lease_seconds=0.6)
    async def slow(payload, ctx):
        runs.append(ctx.lease.token)
        started.set()
        await asyncio.sleep(1.5 if len(runs) == 1 else 0.01)
        return ctx.lease.token

    r = await redis_app.enqueue("slow")
    worker, run = start(redis_app, concurrency=2)
    await asyncio.wait_for(started.wait(), 10)
    admin = redis.Redis.from_url(redis_stack)
    assert admin.delete(f"herd:{{default}}:lease:{r.job_id}") == 1  # as after a restart
    admin.close()
    await eventually(lambda: done(redis_app, r.job_id), timeout=20)
    worker.stop()
    await run
    job = await redis_app.get_job(r.job_id)
    assert runs == [1, 2] and job.result == 2 and job.stalls == 1
    assert worker.stats.lost == 1
