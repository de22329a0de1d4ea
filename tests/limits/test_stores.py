"""What each store does of its own: retention, one index lookup, PgBouncer, for_broker."""

from __future__ import annotations

import psycopg
import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from herd.limits import LIMITERS, Limit, PostgresLimiter, RedisLimiter, for_broker
from herd.limits.base import LIMIT_TTL
from herd.limits.redis import INDEX, limit_key, slots_key
from tests.helpers import eventually

LIM = Limit(rpm=100, max_concurrent=2, period=1.0)


async def test_postgres_purges_scopes_unused_for_the_ttl(pg_url, scope):
    async with PostgresLimiter(pg_url) as limiter:
        assert (await limiter.try_acquire(scope, LIM, 0, "h", 1.0)).granted
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE herd_limits SET used_at = now() - interval '25 hours' WHERE scope = %s",
                (scope,),
            )
        assert await limiter.purge() >= 1
        assert await limiter.stats([scope]) == []


async def test_postgres_purges_in_the_background_of_an_acquire_not_in_a_read(pg_url, scope):
    async with PostgresLimiter(pg_url, purge_every=0.05) as limiter:
        assert (await limiter.try_acquire(scope, LIM, 0, "h", 1.0)).granted
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE herd_limits SET used_at = now() - interval '25 hours' WHERE scope = %s",
                (scope,),
            )
        # The dashboard's read lists what is there and deletes nothing.
        assert scope in {s.scope for s in await limiter.stats()}
        assert scope in {s.scope for s in await limiter.stats()}

        async def gone() -> bool:
            await limiter.try_acquire(scope + ":other", LIM, 0, "h", 1.0)
            return scope not in {s.scope for s in await limiter.stats()}

        await eventually(gone, timeout=5, interval=0.1)


def test_postgres_acquire_is_one_primary_key_lookup(pg_url):
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # As on a table of many scopes, where neither would be chosen.
        conn.execute("SET enable_seqscan = off")
        conn.execute("SET enable_bitmapscan = off")
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN SELECT * FROM herd_limits WHERE scope = 'x' FOR UPDATE"
            ).fetchall()
        )
    assert "Index Scan using herd_limits_pkey" in plan and "Sort" not in plan


async def test_redis_keys_share_a_slot_and_expire(redis_stack, scope):
    async with RedisLimiter(redis_stack) as limiter:
        assert (await limiter.try_acquire(scope, LIM, 0, "h", 5.0)).granted
        client = aioredis.Redis.from_url(redis_stack)
        async with client:
            assert key_slot(limit_key(scope).encode()) == key_slot(slots_key(scope).encode())
            for key in (limit_key(scope), slots_key(scope)):
                assert 0 < await client.ttl(key) <= LIMIT_TTL
            assert await client.zscore(INDEX, scope) is not None
            await client.delete(limit_key(scope), slots_key(scope))  # as if expired
        assert scope not in {s.scope for s in await limiter.stats()}
        async with client:
            assert await client.zscore(INDEX, scope) is None


async def test_postgres_limits_work_behind_pgbouncer(pgbouncer_url, scope):
    async with PostgresLimiter(pgbouncer_url) as limiter:
        for _ in range(3):  # more than once: no statement may be prepared
            assert (await limiter.try_acquire(scope, LIM, 5, "h", 1.0)).granted
            await limiter.release(scope, "h")
        (s,) = await limiter.stats([scope])
        assert s.requests == 3 and s.in_flight == 0


def test_for_broker_names_each_backend_and_refuses_others():
    assert isinstance(for_broker("postgres", "postgresql://x/y"), PostgresLimiter)
    assert isinstance(for_broker("redis", "redis://localhost:1"), RedisLimiter)
    assert set(LIMITERS) == {"postgres", "redis"}
    with pytest.raises(ValueError, match="no limiter for broker 'sqlite'"):
        for_broker("sqlite", "x")


def test_the_package_exports_what_it_lists():
    import herd.limits

    for name in herd.limits.__all__:
        assert hasattr(herd.limits, name), name
