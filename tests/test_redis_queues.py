"""Queue numbers on Redis are a bounded resource: HERD_MAX_QUEUES bounds how many a
caller may take, and an empty queue gives its number back."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from herd.app import App
from herd.config import Settings
from herd.errors import InvalidInput
from herd.queue.base import Completion, NewJob
from herd.queue.redis import RedisBroker, prefix
from herd.queue.redis_numbers import QUEUE_KEYS, QUEUE_MASK
from tests.api.conftest import client_of
from tests.conftest import flush_redis


def job(queue: str) -> NewJob:
    return NewJob("t", {}, queue=queue, lease_seconds=30.0)


@pytest.fixture
async def broker(redis_stack):
    flush_redis(redis_stack)
    # Reclaimed as soon as empty (not 2 hours after the last job finished there), and
    # only when the test sweeps (finished_ttl=0: no sweep of the claims' own).
    b = RedisBroker(redis_stack, max_queues=2, reclaim_idle_minutes=0, finished_ttl=0)
    await b.open()
    yield b
    await b.close()


async def run_all(broker: RedisBroker, queue: str) -> None:
    leases = await broker.claim([queue], "w", 100)
    assert await broker.complete_if_leased([Completion(lease, "ok") for lease in leases])


async def purge_until_reclaimed(broker: RedisBroker, queue: str) -> None:
    """Purge until the queue is reclaimed: a job finished in the purge's own millisecond
    may not be older than 0 s yet (the first purge left the queue now and then)."""
    deadline = time.monotonic() + 10
    while True:
        await broker.purge_finished(older_than=0)
        if queue not in {s.queue for s in await broker.stats()}:
            return
        assert time.monotonic() < deadline, f"queue {queue} was never reclaimed"
        await asyncio.sleep(0.01)


async def test_a_new_queue_past_herd_max_queues_is_refused(broker):
    await broker.enqueue([job("a"), job("b")])
    with pytest.raises(InvalidInput, match=r"HERD_MAX_QUEUES \(2\)"):
        await broker.enqueue([job("c")])
    assert (await broker.enqueue([job("a")]))[0].created  # known queues still take jobs
    assert {s.queue for s in await broker.stats()} == {"a", "b"}


async def test_post_jobs_cannot_create_queues_past_the_bound(redis_stack, pg_url, herd_home):
    flush_redis(redis_stack)
    settings = Settings(home=herd_home, database_url=pg_url, broker="redis",
                        redis_url=redis_stack, max_queues=3)  # fmt: skip
    app = App(settings=settings)
    async with app, client_of(app) as client:
        for n in range(3):
            r = await client.post("/jobs", json={"task": "t", "queue": f"q{n}"})
            assert r.status_code == 201, r.text
        r = await client.post("/jobs", json={"task": "t", "queue": "q3"})
        assert r.status_code == 422 and "HERD_MAX_QUEUES" in r.json()["error"]
        assert r.json()["errors"][0]["field"] == "queue"


async def test_an_empty_queue_gives_its_number_back(broker, redis_stack):
    [old] = await broker.enqueue([job("a")])
    await broker.enqueue([job("b")])
    await run_all(broker, "a")
    await purge_until_reclaimed(broker, "a")  # the sweep, then the reclaim
    assert {s.queue for s in await broker.stats()} == {"b"}
    client = redis.Redis.from_url(redis_stack, decode_responses=True)
    number = old.job_id & QUEUE_MASK
    assert client.zscore(QUEUE_KEYS[3], str(number)) is not None  # free, after a wait
    assert client.hget(QUEUE_KEYS[1], str(number)) is None
    # The old id names no job; the queue, enqueued into again, takes a number anew
    # (the bound, 2, counts queues holding a number: "c" would now be one too many).
    assert await broker.get_jobs([old.job_id]) == []
    [again] = await broker.enqueue([job("a")])
    with pytest.raises(InvalidInput):
        await broker.enqueue([job("c")])
    assert again.job_id & QUEUE_MASK not in (number, 0)
    assert (await broker.get_job(again.job_id)).queue == "a"
    client.close()


async def test_a_number_read_before_its_queue_was_reclaimed_is_not_taken_back(broker, redis_stack):
    other = RedisBroker(redis_stack, reclaim_idle_minutes=0, finished_ttl=0)
    await other.open()
    try:
        # Another process reads the queue's number; the queue is reclaimed meanwhile.
        await other.enqueue([job("a")])
        number, start, _ = await other._numbers.number("a")  # the cached number
        await run_all(other, "a")
        await purge_until_reclaimed(broker, "a")
        seconds, micros = await other._redis.time()
        read_before = seconds * 1_000_000 + micros - 1_000_000
        p = prefix("a")
        late = await other._scripts["enqueue"](
            keys=[p + "meta"],
            args=[p, "a", 1, number, start, 0, read_before,
                  "t", "{}", 0, "", 0, 30.0, 1, 1, ""],
        )  # fmt: skip
        assert late in ("renumber", b"renumber")  # the number is free: not taken back
        # Its cached number is refused as well, and the broker reads a new one.
        [again] = await other.enqueue([job("a")])
        assert again.job_id & QUEUE_MASK != number
        assert (await broker.get_job(again.job_id)).queue == "a"
    finally:
        await other.close()
