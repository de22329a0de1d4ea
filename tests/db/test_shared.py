"""One pool per server per process: stores that name the same URL share it,
bounded by the largest size any of them asked for, and the last one out closes it."""

from __future__ import annotations

import asyncio
import os

import psycopg
import redis

from herd.cache import PostgresCacheStore, RedisCacheStore
from herd.llm.eval import EvalStore
from herd.locks import PostgresLocks, RedisLocks
from herd.queue.postgres import PostgresBroker
from herd.queue.redis import RedisBroker
from tests.helpers import eventually

NAME = f"herd:{os.getpid()}"


def pg_connections(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (NAME,)
        ).fetchone()
    return int(row[0]) if row else 0


def redis_connections(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return sum(1 for c in client.client_list() if c.get("name") == NAME)
    finally:
        client.close()


async def test_postgres_stores_of_one_url_share_one_pool_and_the_last_closes_it(clean_pg):
    # Pools other tests of this process left open are not this test's.
    before = await asyncio.to_thread(pg_connections, clean_pg)
    broker = PostgresBroker(clean_pg, pool_size=6)
    locks, cache = PostgresLocks(clean_pg), PostgresCacheStore(clean_pg)
    ledger = EvalStore(clean_pg)
    for store in (broker, locks, cache, ledger):
        await store.open()
    # Each store keeps more statements in flight than its own size: apart, their
    # pools would open 6 + 4 + 4 + 4 connections (and the locks' a LISTEN one).
    await asyncio.gather(
        *[broker.stats() for _ in range(12)],
        *[locks.acquire(f"l{i}", ttl=5) for i in range(12)],
        *[cache.get("ns", f"k{i}") for i in range(12)],
        *[ledger.execute("SELECT pg_sleep(0.05)") for _ in range(12)],
    )
    assert 0 < await asyncio.to_thread(pg_connections, clean_pg) - before <= 6 + 1
    await broker.close()  # the others keep the pool
    assert await cache.get("ns", "k") is None
    for store in (locks, cache, ledger):
        await store.close()
    await eventually(lambda: asyncio.to_thread(lambda: pg_connections(clean_pg) <= before))


async def test_redis_stores_of_one_url_share_one_bounded_pool(redis_stack):
    before = await asyncio.to_thread(redis_connections, redis_stack)
    broker = RedisBroker(redis_stack, pool_size=5)
    cache, locks = RedisCacheStore(redis_stack), RedisLocks(redis_stack)
    for store in (broker, cache, locks):
        await store.open()
    slow = broker._redis  # a blocking command holds its connection for its whole wait

    async def hold() -> None:
        await slow.blpop(["herd:test:never"], timeout=0.3)

    # Apart, 8 blocking waits would open 8 of the broker's connections, and the
    # cache and the locks 4 each besides.
    await asyncio.gather(
        *[hold() for _ in range(8)],
        *[cache.get("ns", f"k{i}") for i in range(20)],
        *[locks.acquire(f"l{i}", ttl=5) for i in range(20)],
    )
    assert 0 < await asyncio.to_thread(redis_connections, redis_stack) - before <= 5
    for store in (broker, cache, locks):
        await store.close()
    await eventually(lambda: asyncio.to_thread(lambda: redis_connections(redis_stack) <= before))


async def test_the_evaluation_store_and_the_cache_skip_the_check_of_a_fresh_connection(
    clean_pg, monkeypatch
):
    """Their statements fail a job's attempt before its model call or are retried
    through an outage after it, so a connection that answered within FRESH seconds is
    handed to them unchecked (the checks were a third of an evaluation's statements);
    the locks' checkouts are still checked, in their block or not."""
    checks: list[str] = []
    execute = psycopg.AsyncConnection.execute

    async def counting(self, query, params=None, **kw):  # type: ignore[no-untyped-def]
        if query == "":  # the pool's check on checkout (AsyncConnectionPool.check_connection)
            checks.append(query)
        return await execute(self, query, params, **kw)

    ledger, cache, locks = (
        EvalStore(clean_pg),
        PostgresCacheStore(clean_pg),
        PostgresLocks(clean_pg),
    )
    for store in (ledger, cache, locks):
        await store.open()
    monkeypatch.setattr(psycopg.AsyncConnection, "execute", counting)
    try:
        await ledger.execute("SELECT 1")
        await cache.get("ns", "k")
        checks.clear()
        for i in range(5):
            await ledger.execute("SELECT 1")
            assert await cache.get("ns", f"k{i}") is None
        assert checks == []
        for i in range(3):
            async with ledger.pool.connection():  # a checkout of another store inside
                lease = await locks.acquire(f"fresh-{NAME}-{i}", ttl=5)
                assert lease is not None and await locks.release(lease)
        assert len(checks) >= 6  # each acquire and release checked, as before
    finally:
        monkeypatch.undo()
        for store in (ledger, cache, locks):
            await store.close()
