"""Redis-specific behaviour: persistence (AOF), connection drops, vanished lease keys."""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis

from herd import App, BrokerUnavailable, JobStatus, Worker
from herd.db.redis import HeldConnection
from herd.queue.base import Completion, Failure, NewJob, QueueStats
from herd.queue.redis import RedisBroker
from herd.testing.servers.redis_stack import RedisStackServer
from tests.conftest import CACHE, flush_redis
from tests.helpers import eventually


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

    # A lease a loaded machine's heartbeat keeps (0.6 s ones were lost to a stall and
    # ran a third time); the first run lasts until the vanished key cancels it.
    @redis_app.task(name="slow", lease_seconds=3.0)
    async def slow(payload, ctx):
        runs.append(ctx.lease.token)
        started.set()
        await asyncio.sleep(60 if len(runs) == 1 else 0.01)
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
    # Two leases, the second under a greater token (tokens start at the server's clock).
    assert len(runs) == 2 and runs[0] < runs[1] and job.result == runs[1] and job.stalls == 1
    assert worker.stats.lost == 1


def _queue_keys(client: redis.Redis, queue: str) -> set[str]:
    """Every key of the queue but its per-minute throughput (kept for its own TTL)."""
    keys = {k.decode() for k in client.scan_iter(match=f"herd:{{{queue}}}:*", count=1000)}
    return {k for k in keys if ":tp:" not in k}


async def _run_to_success(broker: RedisBroker, n: int) -> list[int]:
    ids = [r.job_id for r in await broker.enqueue([NewJob("t", {"i": i}) for i in range(n)])]
    leases = await broker.claim(["default"], "w", n)
    assert (
        await broker.complete_if_leased([Completion(lease, {"ok": 1}) for lease in leases])
        == [True] * n
    )
    return ids


async def test_every_trace_of_a_succeeded_job_goes_with_its_hash(redis_stack):
    flush_redis(redis_stack)
    client = redis.Redis.from_url(redis_stack)
    broker = RedisBroker(redis_stack, finished_ttl=1)
    await broker.open()
    try:
        # The queue's own structure (its stream and group, its priorities) stays.
        (first,) = await _run_to_success(broker, 1)
        await eventually(lambda: _expired(broker, [first]))
        await eventually(lambda: _swept(broker, 1))
        baseline, size = _queue_keys(client, "default"), client.dbsize() - _tp_keys(client)
        ids = await _run_to_success(broker, 50)
        (s,) = await broker.stats()
        assert s.counts == {JobStatus.SUCCEEDED: 50}
        # No index outside the queue's slot: an id says its queue (herd.queue.redis).
        assert not client.exists("herd:jobq") and client.zcard("herd:{default}:st:succeeded") == 50
        await eventually(lambda: _expired(broker, ids))
        # Expired but not yet swept: no longer counted all the same.
        assert client.zcard("herd:{default}:st:succeeded") == 50
        assert await broker.stats() == [QueueStats("default", {}, 0, None)]
        assert await broker.purge_finished() == 50
        assert _queue_keys(client, "default") == baseline
        assert client.dbsize() - _tp_keys(client) == size
        assert client.hlen("herd:jobq") == 0 and client.xlen("herd:{default}:s:0") == 0
        tp = await broker.throughput(5)
        assert sum(tp.succeeded["default"]) == 51  # the rollup keeps its own time
    finally:
        await broker.close()
        client.close()


async def test_purged_dead_letters_leave_no_hash_index_or_dlq_record(redis_stack):
    flush_redis(redis_stack)
    client = redis.Redis.from_url(redis_stack)
    broker = RedisBroker(redis_stack)
    await broker.open()
    try:
        made = await broker.enqueue([NewJob("t", {}, dedup_key=f"k{i}") for i in range(3)])
        for lease in await broker.claim(["default"], "w", 3):
            await broker.fail_if_leased(Failure(lease, "x", final=True))
        assert client.xlen("herd:{default}:dlq") == 3
        removed = 0

        async def all_three() -> bool:
            nonlocal removed
            removed += await broker.purge_dead(0)
            return removed == 3

        await eventually(all_three)
        assert await broker.get_jobs([m.job_id for m in made]) == []
        assert client.xlen("herd:{default}:dlq") == 0 and client.hlen("herd:jobq") == 0
        left = _queue_keys(client, "default")
        assert not any(":job:" in k or ":dedup:" in k or ":lease:" in k for k in left), left
        assert not any(k.endswith((":st:dead", ":unindexed")) for k in left), left
    finally:
        await broker.close()
        client.close()


def _tp_keys(client: redis.Redis) -> int:
    return sum(1 for _ in client.scan_iter(match="herd:*:tp:*", count=1000))


async def _expired(broker: RedisBroker, ids: list[int]) -> bool:
    return await broker.get_jobs(ids) == []


async def _swept(broker: RedisBroker, n: int) -> bool:
    return await broker.purge_finished() == n


async def test_the_sweep_drops_stream_consumers_idle_with_nothing_pending(redis_stack, monkeypatch):
    flush_redis(redis_stack)
    client = redis.Redis.from_url(redis_stack, decode_responses=True)
    broker = RedisBroker(redis_stack)
    await broker.open()
    try:
        await broker.enqueue([NewJob("t", {}), NewJob("t", {})])
        (done,) = await broker.claim(["default"], "gone-worker", 1)
        await broker.complete_if_leased([Completion(done, None)])
        await broker.claim(["default"], "busy-worker", 1)  # holds a job: stays

        def consumers() -> set[str]:
            return {c["name"] for c in client.xinfo_consumers("herd:{default}:s:0", "herd")}

        assert consumers() == {"gone-worker", "busy-worker"}
        await broker.purge_finished()
        assert consumers() == {"gone-worker", "busy-worker"}  # not idle for an hour
        monkeypatch.setattr("herd.queue.redis.CONSUMER_IDLE_MS", 0)

        async def dropped() -> bool:
            await broker.purge_finished()
            return consumers() == {"busy-worker"}

        await eventually(dropped)
    finally:
        await broker.close()
        client.close()


async def test_a_liveness_mark_keeps_one_connection_past_a_clients_read_timeout(redis_stack):
    """The mark's blocking read outlasts redis-py's default socket timeout (5 s in
    redis-py 8): remade every 5 s, a live worker's mark was briefly gone each time, and a
    claim that looked then took its jobs over as a dead worker's."""
    mark = HeldConnection(redis_stack, "w-long")
    await mark.acquire()
    try:
        first = mark.id
        await asyncio.sleep(6.5)  # the duration under test, not a synchronisation
        assert mark.id == first and mark.held.is_set()
        client = redis.Redis.from_url(redis_stack)
        try:
            listed = client.client_list(client_id=[first.split("@")[0]])
        finally:
            client.close()
        assert [c["name"] for c in listed] == [mark.name]
    finally:
        await mark.release()


async def test_the_busiest_keys_are_read_without_reading_every_key_with_work(redis_stack):
    """3,000 keys with work: the dashboard's busiest 5 come from a script that reads
    the keys running and the 5 waiting most (it read every key's three counters on each
    poll), and are the same 5 as ranking them all; a queue whose ranking is lost (or
    was filled by a herd without one) has it rebuilt."""
    flush_redis(redis_stack)
    client = redis.Redis.from_url(redis_stack)
    broker = RedisBroker(redis_stack)
    await broker.open()
    try:
        # Running: two jobs of k7, one of k9.
        await broker.enqueue([NewJob("t", {}, concurrency_key=k, max_running_per_key=2)
                              for k in ("k7", "k7", "k9")])  # fmt: skip
        assert len(await broker.claim(["default"], "w", 3)) == 3
        # Waiting: a job of every key, and 1, 2 and 3 more of k1, k2 and k3.
        jobs = [NewJob("t", {"i": i}, concurrency_key=f"k{i}", max_running_per_key=2)
                for i in range(3000)]  # fmt: skip
        jobs += [NewJob("t", {}, concurrency_key=f"k{i}", max_running_per_key=2)
                 for i in range(1, 4) for _ in range(i)]  # fmt: skip
        await broker.enqueue(jobs)
        # Every script that changes a key's waiting count keeps the ranking with it.
        assert client.zcard("herd:{default}:kwaitz") == 3000
        assert client.zscore("herd:{default}:kwaitz", "k3") == 4
        want = [("k3", 0, 4), ("k2", 0, 3), ("k7", 2, 1), ("k1", 0, 2), ("k9", 1, 1)]
        top = [(k.key, k.running, k.waiting) for k in await broker.key_stats(5)]
        assert top == want
        (rows,) = await broker._call_many("key_stats", [(["herd:{default}:meta"],
                                                         ["herd:{default}:", 5])])  # fmt: skip
        assert len(rows) <= 5 + 2  # the 5 waiting most and the 2 keys running
        client.delete("herd:{default}:kwaitz")
        top = [(k.key, k.running, k.waiting) for k in await broker.key_stats(5)]
        assert top == want
        assert client.zcard("herd:{default}:kwaitz") == client.hlen("herd:{default}:kwait")
    finally:
        await broker.close()
        client.close()
