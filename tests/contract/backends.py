"""Every backend of every seam, listed once, and the one fixture per seam that runs its
contract suite on each of them (River's driver tests, in pytest).

A seam's table maps a backend's name to what the tests need of it: how to make one,
opened on an emptied server of the session (tests/conftest.py starts them), and, for
the locks and the exact cache, the few things a test does behind the store's back (a
second client, a thief, a count of listeners). A new backend passes a seam's suite by
adding one entry to its table.

    broker       tests/contract/test_{claim,enqueue,...}.py   BROKERS
    limiter      tests/contract/test_limits.py                LIMITERS
    locks        tests/contract/test_locks.py                 LOCKS
    cache_store  tests/contract/test_cache_store.py           CACHE_STORES
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
import redis
import redis.asyncio as aioredis

from herd.cache.base import CacheStore
from herd.cache.postgres import PostgresCacheStore
from herd.cache.redis import RedisCacheStore
from herd.limits.base import Limiter
from herd.limits.registry import for_broker
from herd.locks.base import BaseLocks, LockLease
from herd.locks.postgres import CHANNEL as PG_CHANNEL
from herd.locks.postgres import PostgresLocks
from herd.locks.redis import CHANNEL as REDIS_CHANNEL
from herd.locks.redis import RedisLocks, lock_key
from herd.queue.base import Broker
from herd.queue.postgres import PostgresBroker
from herd.queue.redis import RedisBroker
from tests.helpers import flush_redis, truncate

Request = pytest.FixtureRequest

# -- the servers, emptied for a test


def postgres(request: Request) -> str:
    url = str(request.getfixturevalue("pg_url"))
    truncate(url)
    return url


def pgbouncer(request: Request) -> str:
    """pg_url's database through PgBouncer in transaction mode, with no direct URL (its
    LISTEN goes through the pooler too; the poll is what counts)."""
    truncate(request.getfixturevalue("pg_url"))
    return str(request.getfixturevalue("pgbouncer_url"))


def redis_stack(request: Request) -> str:
    url = str(request.getfixturevalue("redis_stack"))
    flush_redis(url)
    return url


def redis_cluster(request: Request) -> str:
    """A plain URL of one node of a 3-master Redis Cluster."""
    cluster = request.getfixturevalue("redis_cluster_server")
    cluster.flush()
    return str(cluster.url)


def _server(request: Request, fixture: str) -> str:
    return str(request.getfixturevalue(fixture))


# -- job stores (herd.queue.registry)

BROKERS: dict[str, Callable[[Request], Broker]] = {
    "postgres": lambda r: PostgresBroker(postgres(r), pool_size=24),
    "redis": lambda r: RedisBroker(redis_stack(r)),
    "pgbouncer": lambda r: PostgresBroker(pgbouncer(r), pool_size=24),
    "redis-cluster": lambda r: RedisBroker(redis_cluster(r)),
}


@pytest.fixture(params=list(BROKERS))
async def broker(request: Request) -> AsyncIterator[Broker]:
    """Every job store, empty, opened; the contract suite runs once per backend."""
    b = BROKERS[request.param](request)
    await b.open()
    try:
        yield b
    finally:
        await b.close()


# -- fleet limits (herd.limits.registry). Tests use scopes of their own: nothing is emptied.
# A limiter's ``name`` and ``url`` are what another process passes to ``for_broker``.

LIMITERS: dict[str, Callable[[Request], Limiter]] = {
    "postgres": lambda r: for_broker("postgres", _server(r, "pg_url")),
    "redis": lambda r: for_broker("redis", _server(r, "redis_stack")),
    "redis-cluster": lambda r: for_broker("redis", _server(r, "redis_cluster")),
}


@pytest.fixture(params=list(LIMITERS))
async def limiter(request: Request) -> AsyncIterator[Limiter]:
    """An opened limiter of each backend; tests use scopes of their own (``scope``)."""
    lim = LIMITERS[request.param](request)
    await lim.open()
    try:
        yield lim
    finally:
        await lim.close()


@pytest.fixture
def scope() -> str:
    return f"test:{uuid.uuid4().hex[:12]}:nokey"


# -- fenced locks (herd.locks.registry). Tests use lock names of their own.


@dataclass
class LockBackend:
    """One lock store, and what a test does behind its back."""

    kind: str  # as tests/apps/lockrace.py names it
    url: str
    locks: BaseLocks
    unreachable: str  # a URL where no server answers

    def other(self, **kw: float) -> BaseLocks:
        """A second, independent client: another process as far as the lock can tell."""
        raise NotImplementedError

    async def steal(self, lease: LockLease) -> int:
        """Hand the lock to someone else behind the holder's back; returns their token."""
        raise NotImplementedError

    async def listeners(self) -> int:
        """Clients waiting for a release notification."""
        raise NotImplementedError

    async def kill_connections(self) -> int:
        """Cut every client's connection (not this one's); how many were cut."""
        raise NotImplementedError

    async def race_counter(self, name: str) -> None:
        """The counter tests/apps/lockrace.py keeps in the store, at 0."""
        raise NotImplementedError


class PostgresLockBackend(LockBackend):
    def other(self, **kw: float) -> BaseLocks:
        return PostgresLocks(self.url, auto_migrate=False, **kw)

    async def _execute(self, query: str, params: tuple[Any, ...] = ()) -> Any:
        conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        async with conn:
            cur = await conn.execute(query, params)
            return await cur.fetchone() if cur.description else None

    async def steal(self, lease: LockLease) -> int:
        token = lease.token + 1000
        await self._execute(
            "UPDATE herd_locks SET token = %s, owner = 'thief',"
            " expires_at = now() + interval '60 seconds' WHERE name = %s",
            (token, lease.name),
        )
        return token

    async def listeners(self) -> int:
        row = await self._execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query = %s AND state = 'idle'",
            (f'LISTEN "{PG_CHANNEL}"',),
        )
        return int(row[0]) if row else 0

    async def kill_connections(self) -> int:
        row = await self._execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend'"
        )
        return int(row[0]) if row else 0

    async def race_counter(self, name: str) -> None:
        await self._execute(
            "CREATE TABLE IF NOT EXISTS lock_race (name text PRIMARY KEY, inside int NOT NULL)"
        )
        await self._execute("INSERT INTO lock_race VALUES (%s, 0)", (name,))


class RedisLockBackend(LockBackend):
    def other(self, **kw: float) -> BaseLocks:
        return RedisLocks(self.url, **kw)

    async def steal(self, lease: LockLease) -> int:
        token = lease.token + 1000
        async with aioredis.Redis.from_url(self.url) as client:
            await client.set(lock_key(lease.name), token, px=60_000)
        return token

    async def listeners(self) -> int:
        async with aioredis.Redis.from_url(self.url) as client:
            return int((await client.pubsub_numsub(REDIS_CHANNEL))[0][1])

    async def kill_connections(self) -> int:
        async with aioredis.Redis.from_url(self.url) as client:
            return int(await client.client_kill_filter(_type="normal", skipme=True))

    async def race_counter(self, name: str) -> None:
        async with aioredis.Redis.from_url(self.url) as client:
            await client.set(f"lockrace:{name}:inside", 0)


def _postgres_locks(r: Request) -> LockBackend:
    url = _server(r, "pg_url")
    return PostgresLockBackend(
        "postgres",
        url,
        PostgresLocks(url),
        "postgresql://herd@127.0.0.1:1/herd?connect_timeout=2",
    )


def _redis_locks(r: Request) -> LockBackend:
    url = _server(r, "redis_stack")
    return RedisLockBackend("redis", url, RedisLocks(url), "redis://127.0.0.1:1/0")


LOCKS: dict[str, Callable[[Request], LockBackend]] = {
    "postgres": _postgres_locks,
    "redis": _redis_locks,
}


@pytest.fixture(params=list(LOCKS))
async def lock_backend(request: Request) -> AsyncIterator[LockBackend]:
    b = LOCKS[request.param](request)
    async with b.locks:
        yield b


# -- the exact cache's store and its singleflight locks (herd.cache.stores)


@dataclass
class CacheBackend:
    """One exact-cache store, its locks, and the calls tests/apps/cache_race.py logs."""

    kind: str  # as tests/apps/cache_race.py names it
    url: str
    store: CacheStore
    locks: BaseLocks

    def calls(self, key: str) -> list[int]:
        """The pids of the processes that computed ``key``."""
        raise NotImplementedError


class PostgresCacheBackend(CacheBackend):
    def calls(self, key: str) -> list[int]:
        with psycopg.connect(self.url) as conn:
            return [r[0] for r in conn.execute("SELECT pid FROM race_calls WHERE key = %s", (key,))]


class RedisCacheBackend(CacheBackend):
    def calls(self, key: str) -> list[int]:
        with redis.Redis.from_url(self.url) as client:
            return [int(p) for p in client.lrange(f"race_calls:{key}", 0, -1)]


def _postgres_cache(r: Request) -> CacheBackend:
    url = _server(r, "pg_url")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE herd_cache, herd_cache_stats")
        conn.execute("CREATE TABLE IF NOT EXISTS race_calls (key text, pid int)")
        conn.execute("TRUNCATE race_calls")
    return PostgresCacheBackend(
        "postgres", url, PostgresCacheStore(url), PostgresLocks(url, poll_interval=0.1)
    )


def _redis_cache(r: Request) -> CacheBackend:
    url = redis_stack(r)
    return RedisCacheBackend("redis", url, RedisCacheStore(url), RedisLocks(url, poll_interval=0.1))


CACHE_STORES: dict[str, Callable[[Request], CacheBackend]] = {
    "postgres": _postgres_cache,
    "redis": _redis_cache,
}


@pytest.fixture(params=list(CACHE_STORES))
async def cache_backend(request: Request) -> AsyncIterator[CacheBackend]:
    b = CACHE_STORES[request.param](request)
    await b.store.open()
    await b.locks.open()
    try:
        yield b
    finally:
        await b.locks.close()
        await b.store.close()
