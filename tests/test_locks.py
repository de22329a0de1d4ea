"""herd.locks: what each lock store does of its own. The suite every store passes is
tests/contract/test_locks.py.
"""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest
import redis.asyncio as aioredis
from psycopg_pool import AsyncConnectionPool
from redis.crc import key_slot

import herd.locks
from herd.errors import BrokerUnavailable, LeaseLost
from herd.locks import PostgresLocks, RedisLocks
from herd.locks.redis import lock_key, seq_key


@pytest.fixture
def name() -> str:
    return f"test-{uuid.uuid4().hex}"


# -- backend specifics


async def test_unreachable_servers_raise_broker_unavailable() -> None:
    for locks in (
        RedisLocks("redis://127.0.0.1:1/0"),
        PostgresLocks("postgresql://herd@127.0.0.1:1/herd?connect_timeout=2"),
    ):
        with pytest.raises(BrokerUnavailable):
            await locks.open()
        await locks.close()


async def test_redis_keys_share_a_cluster_slot() -> None:
    for name in ("partition:7", "kjv/genesis/1/1", "ключ", "x" * 1024):
        assert key_slot(lock_key(name).encode()) == key_slot(seq_key(name).encode()), name
    assert lock_key("n") == "herd:lock:{n}" and seq_key("n") == "herd:lock:{n}:seq"


@pytest.mark.parametrize("protocol", [2, 3])
async def test_redis_with_a_client_of_your_own(redis_stack: str, protocol: int, name: str) -> None:
    client = aioredis.Redis.from_url(redis_stack, protocol=protocol, decode_responses=True)
    async with client:
        locks = RedisLocks(client)
        async with locks:
            lease = await locks.acquire(name, ttl=10)
            assert lease is not None and await locks.acquire(name, ttl=10) is None
            assert await locks.renew(lease) and await locks.check(lease)
            assert await locks.release(lease) and not await locks.check(lease)
        assert await client.ping()  # not ours to close


async def test_postgres_with_a_pool_of_your_own(pg_url: str, name: str) -> None:
    async with AsyncConnectionPool(pg_url, min_size=1, max_size=2) as pool:
        async with PostgresLocks(pool) as locks:
            lease = await locks.acquire(name, ttl=10)
            assert lease is not None and await locks.acquire(name, ttl=10) is None
            assert await locks.renew(lease) and await locks.check(lease)
            assert await locks.release(lease) and not await locks.check(lease)
        async with pool.connection() as conn:
            await conn.execute("SELECT 1")  # not ours to close


async def test_postgres_release_keeps_the_row(pg_url: str, name: str) -> None:
    async with PostgresLocks(pg_url) as locks:
        lease = await locks.acquire(name, ttl=10, owner="me")
        assert lease is not None and await locks.release(lease)
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(
            "SELECT token, owner, expires_at < now() FROM herd_locks WHERE name = %s", (name,)
        ).fetchone()
    assert row == (lease.token, "me", True)


async def test_postgres_assert_held_fences_a_transaction(pg_url: str, name: str) -> None:
    conn = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
    async with conn, PostgresLocks(pg_url) as locks:
        lease = await locks.acquire(name, ttl=0.3)
        assert lease is not None
        async with conn.transaction():
            await locks.assert_held(conn, lease)
            # Past its ttl, yet no takeover can commit until this transaction ends.
            await asyncio.sleep(0.4)
            takeover = asyncio.create_task(locks.acquire(name, ttl=10))
            done, _ = await asyncio.wait([takeover], timeout=0.5)
            assert not done
        new = await asyncio.wait_for(takeover, 5)
        assert new is not None and new.token > lease.token
        with pytest.raises(LeaseLost, match=name):
            async with conn.transaction():
                await locks.assert_held(conn, lease)
        async with conn.transaction():
            await locks.assert_held(conn, new)


async def test_postgres_assert_held_refuses_an_expired_lease(pg_url: str, name: str) -> None:
    conn = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
    async with conn, PostgresLocks(pg_url) as locks:
        lease = await locks.acquire(name, ttl=0.2)
        assert lease is not None
        async with conn.transaction():
            await conn.execute("SELECT 1")  # the transaction's now() is fixed from here
            await asyncio.sleep(0.3)
            with pytest.raises(LeaseLost):
                await locks.assert_held(conn, lease)


async def test_postgres_assert_held_needs_a_transaction(pg_url: str, name: str) -> None:
    conn = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
    async with conn, PostgresLocks(pg_url) as locks:
        lease = await locks.acquire(name, ttl=10)
        assert lease is not None
        with pytest.raises(ValueError, match="transaction"):
            await locks.assert_held(conn, lease)


def test_the_package_exports_its_api() -> None:
    for symbol in herd.locks.__all__:
        assert getattr(herd.locks, symbol) is not None
    assert {"LockLease", "Locks", "RedisLocks", "PostgresLocks", "LockNotAcquired"} <= set(
        herd.locks.__all__
    )
