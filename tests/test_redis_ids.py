"""Job ids on Redis outlive the server's data: a restart without AOF, or a flush,
gives no id that was given before (PostgreSQL rows still name those)."""

from __future__ import annotations

import pytest
import redis

from herd.errors import BrokerError
from herd.queue.base import NewJob
from herd.queue.redis import RedisBroker, prefix
from herd.queue.redis_numbers import QUEUE_BITS
from herd.testing.servers.redis_stack import RedisStackServer
from tests.conftest import CACHE, flush_redis
from tests.helpers import eventually

EPOCH, IDS_PER_SECOND = 1767225600, 4  # enqueue.lua's clock floor


@pytest.fixture
def volatile_server(tmp_path):
    server = RedisStackServer(CACHE / "cache", tmp_path / "redis", appendonly=False)
    server.start()
    yield server
    server.stop()


def jobs(queue: str, n: int) -> list[NewJob]:
    return [NewJob("t", {"i": i}, queue=queue, lease_seconds=30.0) for i in range(n)]


async def enqueue(url: str, batch: list[NewJob]) -> list[int]:
    broker = RedisBroker(url)
    await broker.open()
    try:
        return [r.job_id for r in await broker.enqueue(batch)]
    finally:
        await broker.close()


async def test_a_new_process_gives_no_old_id_after_redis_restarts_without_aof(volatile_server):
    url = volatile_server.url
    before = await enqueue(url, jobs("a", 2) + jobs("b", 1))
    volatile_server.kill()  # no AOF, no snapshot: every key is gone
    volatile_server.start()
    client = redis.Redis.from_url(url)

    def clock_floor() -> int:
        seconds, micros = client.time()
        return (seconds - EPOCH) * IDS_PER_SECOND + micros * IDS_PER_SECOND // 1_000_000

    # A fresh process knows no id: only the server's clock floors the new counters,
    # and it has moved past the old ones once a quarter of a second has gone by.
    highest = max(i >> QUEUE_BITS for i in before)

    async def clock_passed() -> bool:
        return clock_floor() > highest

    await eventually(clock_passed)
    after = await enqueue(url, jobs("b", 1) + jobs("a", 2))
    client.close()
    assert not set(before) & set(after), (before, after)
    assert all(i < 2**53 for i in after)  # exact as JavaScript numbers (the dashboard)


async def test_a_process_gives_no_id_it_holds_after_redis_loses_its_data(redis_stack):
    flush_redis(redis_stack)
    broker = RedisBroker(redis_stack)
    await broker.open()
    try:
        # Many ids in one go run the counter ahead of the clock floor.
        before = [r.job_id for r in await broker.enqueue(jobs("a", 200) + jobs("b", 5))]
        flush_redis(redis_stack)
        after = [r.job_id for r in await broker.enqueue(jobs("b", 5) + jobs("a", 200))]
        assert not set(before) & set(after)
        # Both queues are numbered again, each its own number, and found by id.
        assert {j.queue for j in await broker.get_jobs(after)} == {"a", "b"}
        other = RedisBroker(redis_stack)
        await other.open()
        try:
            found = await other.get_jobs([after[0], after[-1]])
            assert [j.queue for j in found] == ["b", "a"]
            assert {s.queue for s in await other.stats()} == {"a", "b"}
        finally:
            await other.close()
    finally:
        await broker.close()


async def test_a_queue_whose_ids_would_pass_2_53_refuses_to_enqueue(redis_stack):
    flush_redis(redis_stack)
    broker = RedisBroker(redis_stack)
    await broker.open()
    try:
        [first] = await broker.enqueue(jobs("a", 1))
        client = redis.Redis.from_url(redis_stack)
        client.set(prefix("a") + "ids", 2**33 - 2)  # one id left below 2**53
        client.close()
        [last] = await broker.enqueue(jobs("a", 1))
        assert last.job_id < 2**53
        with pytest.raises(BrokerError, match="job ids of queue a are used up"):
            await broker.enqueue(jobs("a", 1))
        assert len(await broker.list_jobs(queue="a")) == 2  # nothing written
        assert first.job_id != last.job_id
    finally:
        await broker.close()
