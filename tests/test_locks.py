"""herd.locks: one suite, run on PostgreSQL and on Redis.

Each test uses lock names of its own (uuid), so no test needs to clean up
another's table rows or keys.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import redis.asyncio as aioredis
from psycopg_pool import AsyncConnectionPool
from redis.crc import key_slot

import herd.locks
from herd.errors import BrokerUnavailable, LeaseLost, LockNotAcquired
from herd.locks import BaseLocks, LockLease, PostgresLocks, RedisLocks
from herd.locks.postgres import CHANNEL as PG_CHANNEL
from herd.locks.redis import CHANNEL as REDIS_CHANNEL
from herd.locks.redis import lock_key, seq_key
from tests.helpers import eventually

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Backend:
    kind: str
    url: str
    locks: BaseLocks

    def other(self, **kw: float) -> BaseLocks:
        """A second, independent client: another process as far as the lock can tell."""
        if self.kind == "redis":
            return RedisLocks(self.url, **kw)
        return PostgresLocks(self.url, auto_migrate=False, **kw)

    async def steal(self, lease: LockLease) -> int:
        """Hand the lock to someone else behind the holder's back; returns their token."""
        token = lease.token + 1000
        if self.kind == "redis":
            client = aioredis.Redis.from_url(self.url)
            async with client:
                await client.set(lock_key(lease.name), token, px=60_000)
        else:
            conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
            async with conn:
                await conn.execute(
                    "UPDATE herd_locks SET token = %s, owner = 'thief',"
                    " expires_at = now() + interval '60 seconds' WHERE name = %s",
                    (token, lease.name),
                )
        return token


@pytest.fixture(params=["postgres", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    kind = request.param
    url = request.getfixturevalue("pg_url" if kind == "postgres" else "redis_stack")
    b = Backend(kind, url, RedisLocks(url) if kind == "redis" else PostgresLocks(url))
    async with b.locks:
        yield b


@pytest.fixture
def name() -> str:
    return f"test-{uuid.uuid4().hex}"


# -- the verbs


async def test_a_held_lock_is_refused_until_released(backend: Backend, name: str) -> None:
    locks = backend.locks
    a = await locks.acquire(name, ttl=10, owner="a")
    assert a is not None and a.name == name and a.owner == "a" and a.ttl == 10
    assert await locks.acquire(name, ttl=10) is None
    assert await locks.check(a)
    assert await locks.release(a)
    assert not await locks.check(a)
    b = await locks.acquire(name, ttl=10)
    assert b is not None and b.token > a.token and b.owner == locks.owner
    assert await locks.release(b)


async def test_an_owner_naming_the_work_takes_over_its_own_earlier_holding(
    backend: Backend, name: str
) -> None:
    """A job re-run after its worker died takes the lock that run held, at once."""
    locks, dead = backend.locks, backend.other()
    async with dead:
        first = await dead.acquire(name, ttl=0.6, owner="job:7")
        assert first is not None
        # Renewed past its first ttl: the owner is kept as long as the lock.
        await asyncio.sleep(0.4)
        assert await dead.renew(first)
        await asyncio.sleep(0.4)
        assert await dead.renew(first)
    assert await locks.acquire(name, ttl=30, owner="job:7") is None  # not asked to
    assert await locks.acquire(name, ttl=30, owner="job:8", take_over=True) is None
    with pytest.raises(ValueError, match="take_over needs an owner"):
        await locks.acquire(name, ttl=30, take_over=True)
    async with locks.hold(name, ttl=30, owner="job:7", take_over=True) as again:
        assert again.token > first.token and again.owner == "job:7"
        assert not await locks.check(first) and not await locks.renew(first)
        assert not await locks.release(first)
        assert await locks.check(again)
    assert await locks.acquire(name, ttl=1, owner="job:8") is not None  # released


async def test_renew_keeps_the_lock_past_its_ttl(backend: Backend, name: str) -> None:
    locks = backend.locks
    lease = await locks.acquire(name, ttl=0.4)
    assert lease is not None
    end = time.monotonic() + 1.2
    while time.monotonic() < end:
        assert await locks.renew(lease)
        await asyncio.sleep(0.1)  # time is the subject: three ttls go by
    assert await locks.check(lease)
    assert await locks.acquire(name, ttl=1) is None
    assert await locks.release(lease)


async def test_expired_holder_is_taken_over_and_refused(backend: Backend, name: str) -> None:
    locks = backend.locks
    a = await locks.acquire(name, ttl=0.3, owner="a")
    assert a is not None
    await asyncio.sleep(0.4)  # A stops renewing; its ttl runs out
    assert not await locks.check(a)
    b = await locks.acquire(name, ttl=10, owner="b")
    assert b is not None and b.token > a.token
    assert not await locks.renew(a)
    assert not await locks.release(a)
    assert await locks.check(b)
    assert await locks.acquire(name, ttl=10) is None  # A's release freed nothing
    assert await locks.release(b)


async def test_an_expired_lease_cannot_be_renewed_back(backend: Backend, name: str) -> None:
    locks = backend.locks
    a = await locks.acquire(name, ttl=0.2)
    assert a is not None
    await asyncio.sleep(0.3)
    assert not await locks.renew(a)  # nobody took over, yet expired is lost
    assert not await locks.check(a)


async def test_stale_release_is_refused(backend: Backend, name: str) -> None:
    locks = backend.locks
    a = await locks.acquire(name, ttl=10)
    assert a is not None
    assert await locks.release(a)
    b = await locks.acquire(name, ttl=10)
    assert b is not None
    assert not await locks.release(a)  # a second release of A's lease
    assert not await locks.renew(a)
    assert await locks.check(b)
    assert await locks.acquire(name, ttl=10) is None
    assert await locks.release(b)


async def test_tokens_increase_across_releases_and_expiries(backend: Backend, name: str) -> None:
    locks = backend.locks
    tokens = []
    for _ in range(50):
        lease = await locks.acquire(name, ttl=10)
        assert lease is not None
        tokens.append(lease.token)
        assert await locks.release(lease)
    for _ in range(3):
        lease = await locks.acquire(name, ttl=0.05)
        assert lease is not None
        tokens.append(lease.token)
        await asyncio.sleep(0.1)  # let it expire unreleased
    lease = await locks.acquire(name, ttl=10)
    assert lease is not None
    tokens.append(lease.token)
    assert all(a < b for a, b in zip(tokens, tokens[1:], strict=False)), tokens


async def test_arguments_are_checked(backend: Backend) -> None:
    with pytest.raises(ValueError, match="name"):
        await backend.locks.acquire("", ttl=1)
    for bad in ("a{b}c", "}{", "x" * 1025):
        with pytest.raises(ValueError, match="name"):
            await backend.locks.acquire(bad, ttl=1)
    with pytest.raises(ValueError, match="ttl"):
        await backend.locks.acquire("x", ttl=0)
    with pytest.raises(ValueError, match="wait"):
        await backend.locks.acquire("x", ttl=1, wait=-1)


# -- waiting


async def test_wait_times_out_with_none(backend: Backend, name: str) -> None:
    locks = backend.locks
    held = await locks.acquire(name, ttl=10)
    assert held is not None
    t0 = time.monotonic()
    assert await locks.acquire(name, ttl=10, wait=0.3) is None
    assert 0.3 <= time.monotonic() - t0 < 1.5


async def test_a_release_wakes_a_waiter_at_once(backend: Backend, name: str) -> None:
    # A poll interval far beyond the test's patience: only the notification can wake it.
    waiter = backend.other(poll_interval=30.0)
    async with waiter:
        held = await backend.locks.acquire(name, ttl=30)
        assert held is not None
        before = await _listeners(backend)
        task = asyncio.create_task(waiter.acquire(name, ttl=10, wait=20))
        # The first refused attempt starts the listener; the release must come after it
        # subscribed, or only the (30 s) poll could find it.
        await eventually(lambda: _more_listeners(backend, before))
        released_at = time.monotonic()
        assert await backend.locks.release(held)
        lease = await asyncio.wait_for(task, 5)
        assert lease is not None and lease.token > held.token
        assert time.monotonic() - released_at < 2.0


async def _listeners(backend: Backend) -> int:
    if backend.kind == "redis":
        client = aioredis.Redis.from_url(backend.url)
        async with client:
            return int((await client.pubsub_numsub(REDIS_CHANNEL))[0][1])
    conn = await psycopg.AsyncConnection.connect(backend.url, autocommit=True)
    async with conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query = %s AND state = 'idle'",
            (f'LISTEN "{PG_CHANNEL}"',),
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def _more_listeners(backend: Backend, before: int) -> bool:
    return await _listeners(backend) > before


async def test_a_waiter_takes_over_an_expired_lock(backend: Backend, name: str) -> None:
    locks = backend.locks
    held = await locks.acquire(name, ttl=0.3)
    assert held is not None
    t0 = time.monotonic()
    lease = await locks.acquire(name, ttl=10, wait=5)
    assert lease is not None and lease.token > held.token
    assert 0.2 <= time.monotonic() - t0 < 0.3 + 2 * locks.poll_interval + 0.5


# -- across processes


async def test_mutual_exclusion_across_processes(backend: Backend, name: str) -> None:
    procs, contenders, rounds = 4, 5, 5
    if backend.kind == "redis":
        client = aioredis.Redis.from_url(backend.url)
        async with client:
            await client.set(f"lockrace:{name}:inside", 0)
    else:
        conn = await psycopg.AsyncConnection.connect(backend.url, autocommit=True)
        async with conn:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS lock_race (name text PRIMARY KEY, inside int NOT NULL)"
            )
            await conn.execute("INSERT INTO lock_race VALUES (%s, 0)", (name,))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    args = ["-m", "tests.apps.lockrace", backend.kind, backend.url, name]
    children = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            *args,
            str(contenders),
            str(rounds),
            cwd=ROOT,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(procs)
    ]
    try:
        for child in children:  # every process is up before any contends
            assert child.stdout is not None
            line = await asyncio.wait_for(child.stdout.readline(), 20)
            assert line == b"ready\n", line + (await child.stderr.read() if child.stderr else b"")
        outputs = await asyncio.wait_for(
            asyncio.gather(*(child.communicate(b"go\n") for child in children)), 30
        )
    finally:
        for child in children:
            if child.returncode is None:
                child.kill()
                await child.wait()
    for child, (_, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, err.decode()
    marks = sorted(
        json.loads(line) for out, _ in outputs for line in out.decode().splitlines() if line
    )
    assert len(marks) == procs * contenders * rounds  # every acquisition happened
    assert [m[3:] for m in marks] == [[1, 0]] * len(marks)  # nobody else was ever inside
    # In token order, each critical section ended before the next one began.
    for (t1, _, end1, *_), (t2, start2, *_) in zip(marks, marks[1:], strict=False):
        assert t1 < t2 and end1 < start2, (t1, t2)


# -- hold()


async def test_hold_renews_while_the_body_runs(backend: Backend, name: str) -> None:
    locks = backend.locks
    async with locks.hold(name, ttl=0.3) as lease:
        await asyncio.sleep(1.0)  # more than three ttls
        assert await locks.check(lease)
        assert await locks.acquire(name, ttl=1) is None
    assert not await locks.check(lease)  # released on exit
    assert await locks.acquire(name, ttl=1) is not None


async def test_hold_cancels_the_body_when_the_lock_is_lost(backend: Backend, name: str) -> None:
    locks = backend.locks
    cancelled = asyncio.Event()
    lost_at = 0.0
    with pytest.raises(LeaseLost, match=name):
        async with locks.hold(name, ttl=0.5) as lease:
            thief = await backend.steal(lease)
            lost_at = time.monotonic()
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                cancelled.set()
                raise
    assert cancelled.is_set()
    assert time.monotonic() - lost_at < 0.5
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    stolen = LockLease(name, thief, "thief", 60)
    assert await locks.check(stolen)  # the loser's exit released nothing


async def test_hold_exits_when_a_renewal_drops_the_exits_cancellation(
    backend: Backend, name: str
) -> None:
    # Python 3.11's asyncio.wait_for (inside psycopg_pool's getconn) returns its
    # result and drops a cancellation that lands in the same loop iteration
    # (gh-86296). The exit's cancellation of the renewer can be lost that way;
    # the exit must still end, and release the lock.
    locks = backend.locks
    inside = asyncio.Event()
    real_renew = locks.renew

    async def renew_dropping_one_cancellation(lease: LockLease) -> bool:
        inside.set()
        try:
            await asyncio.sleep(0.2)
        except asyncio.CancelledError:
            pass  # what wait_for does in that race
        return await real_renew(lease)

    locks.renew = renew_dropping_one_cancellation  # type: ignore[method-assign]
    try:
        async with asyncio.timeout(5):
            async with locks.hold(name, ttl=0.6) as lease:
                await inside.wait()  # the renewer is now inside renew()
    finally:
        locks.renew = real_renew  # type: ignore[method-assign]
    assert not await locks.check(lease)
    assert await locks.acquire(name, ttl=1) is not None


async def test_hold_rides_out_killed_connections(backend: Backend, name: str) -> None:
    locks = backend.locks
    async with locks.hold(name, ttl=0.6) as lease:
        assert await _kill_connections(backend) >= 1
        await asyncio.sleep(1.2)  # two ttls: renewals must have failed, retried and succeeded
        assert await locks.check(lease)


async def _kill_connections(backend: Backend) -> int:
    if backend.kind == "redis":
        client = aioredis.Redis.from_url(backend.url)
        async with client:
            return int(await client.client_kill_filter(_type="normal", skipme=True))
    conn = await psycopg.AsyncConnection.connect(backend.url, autocommit=True)
    async with conn:
        cur = await conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend'"
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def test_hold_gives_up_when_renewals_fail_until_expiry(
    backend: Backend, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    locks = backend.locks

    async def unreachable(lease: LockLease) -> bool:
        raise BrokerUnavailable("the server is gone")

    t0 = time.monotonic()
    with pytest.raises(LeaseLost, match="no renewal confirmed"):
        async with locks.hold(name, ttl=0.6):
            monkeypatch.setattr(locks, "renew", unreachable)
            await asyncio.sleep(5)
    assert time.monotonic() - t0 < 0.6 + 0.3  # cancelled by the time the lease ran out


async def test_hold_raises_lease_lost_even_if_the_body_swallows_cancel(
    backend: Backend, name: str
) -> None:
    locks = backend.locks
    with pytest.raises(LeaseLost):
        async with locks.hold(name, ttl=0.3) as lease:
            await backend.steal(lease)
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                pass  # bad manners, but the block must still not end as if all went well


async def test_hold_refuses_a_held_lock(backend: Backend, name: str) -> None:
    locks = backend.locks
    held = await locks.acquire(name, ttl=10)
    assert held is not None
    with pytest.raises(LockNotAcquired, match=name):
        async with locks.hold(name, ttl=1, wait=0.2):
            pytest.fail("entered a held lock")
    assert await locks.check(held)


async def test_hold_releases_when_the_body_raises(backend: Backend, name: str) -> None:
    locks = backend.locks
    with pytest.raises(KeyError):
        async with locks.hold(name, ttl=10) as lease:
            raise KeyError("boom")
    assert not await locks.check(lease)
    assert await locks.acquire(name, ttl=1) is not None


async def test_an_outside_cancel_stays_a_cancel(backend: Backend, name: str) -> None:
    locks = backend.locks
    entered = asyncio.Event()
    leases: list[LockLease] = []

    async def body() -> None:
        async with locks.hold(name, ttl=10) as lease:
            leases.append(lease)
            entered.set()
            await asyncio.sleep(5)

    task = asyncio.create_task(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not await locks.check(leases[0])


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
