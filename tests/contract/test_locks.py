"""Contract: fenced locks (herd.locks), on every lock store (tests/contract/backends.py).

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
from pathlib import Path

import pytest

from herd.errors import BrokerUnavailable, LeaseLost, LockNotAcquired
from herd.locks import LockLease
from tests.contract.backends import LockBackend
from tests.helpers import STARTUP, LeaseRun, eventually, within_lease

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def name() -> str:
    return f"test-{uuid.uuid4().hex}"


async def _more_listeners(lock_backend: LockBackend, before: int) -> bool:
    return await lock_backend.listeners() > before


# -- the verbs


async def test_a_held_lock_is_refused_until_released(lock_backend: LockBackend, name: str) -> None:
    locks = lock_backend.locks
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
    lock_backend: LockBackend, name: str
) -> None:
    """A job re-run after its worker died takes the lock that run held, at once."""
    locks, dead = lock_backend.locks, lock_backend.other()

    async def scenario(run: LeaseRun) -> None:
        lock = f"{name}-{run.queue}"
        run.start()
        first = await dead.acquire(lock, ttl=run.lease, owner="job:7")
        assert first is not None
        # Renewed past its first ttl: the owner is kept as long as the lock.
        for _ in range(2):
            await asyncio.sleep(run.lease * 2 / 3)
            sent = time.monotonic()
            assert await dead.renew(first)
            run.start(at=sent)  # the steps below need this renewal's ttl to hold
        assert await locks.acquire(lock, ttl=30, owner="job:7") is None  # not asked to
        assert await locks.acquire(lock, ttl=30, owner="job:8", take_over=True) is None
        with pytest.raises(ValueError, match="take_over needs an owner"):
            await locks.acquire(lock, ttl=30, take_over=True)
        async with locks.hold(lock, ttl=30, owner="job:7", take_over=True) as again:
            assert again.token > first.token and again.owner == "job:7"
            assert not await locks.check(first) and not await locks.renew(first)
            assert not await locks.release(first)
            assert await locks.check(again)
        assert await locks.acquire(lock, ttl=1, owner="job:8") is not None  # released

    async with dead:
        await within_lease(scenario, lease=0.6)


async def test_renew_keeps_the_lock_past_its_ttl(lock_backend: LockBackend, name: str) -> None:
    locks = lock_backend.locks

    async def scenario(run: LeaseRun) -> None:
        lock = f"{name}-{run.queue}"
        run.start()
        lease = await locks.acquire(lock, ttl=run.lease)
        assert lease is not None
        end = time.monotonic() + 3 * run.lease
        while time.monotonic() < end:
            sent = time.monotonic()
            assert await locks.renew(lease)
            run.start(at=sent)
            await asyncio.sleep(run.lease / 4)  # time is the subject: three ttls go by
        assert await locks.check(lease)
        assert await locks.acquire(lock, ttl=1) is None
        assert await locks.release(lease)

    await within_lease(scenario, lease=0.4)


async def test_expired_holder_is_taken_over_and_refused(
    lock_backend: LockBackend, name: str
) -> None:
    locks = lock_backend.locks
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


async def test_an_expired_lease_cannot_be_renewed_back(
    lock_backend: LockBackend, name: str
) -> None:
    locks = lock_backend.locks
    a = await locks.acquire(name, ttl=0.2)
    assert a is not None
    await asyncio.sleep(0.3)
    assert not await locks.renew(a)  # nobody took over, yet expired is lost
    assert not await locks.check(a)


async def test_stale_release_is_refused(lock_backend: LockBackend, name: str) -> None:
    locks = lock_backend.locks
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


async def test_tokens_increase_across_releases_and_expiries(
    lock_backend: LockBackend, name: str
) -> None:
    locks = lock_backend.locks
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


async def test_arguments_are_checked(lock_backend: LockBackend) -> None:
    with pytest.raises(ValueError, match="name"):
        await lock_backend.locks.acquire("", ttl=1)
    for bad in ("a{b}c", "}{", "x" * 1025):
        with pytest.raises(ValueError, match="name"):
            await lock_backend.locks.acquire(bad, ttl=1)
    with pytest.raises(ValueError, match="ttl"):
        await lock_backend.locks.acquire("x", ttl=0)
    with pytest.raises(ValueError, match="wait"):
        await lock_backend.locks.acquire("x", ttl=1, wait=-1)


# -- waiting


async def test_wait_times_out_with_none(lock_backend: LockBackend, name: str) -> None:
    locks = lock_backend.locks
    held = await locks.acquire(name, ttl=10)
    assert held is not None
    t0 = time.monotonic()
    assert await locks.acquire(name, ttl=10, wait=0.3) is None
    assert 0.3 <= time.monotonic() - t0 < 1.5


async def test_a_release_wakes_a_waiter_at_once(lock_backend: LockBackend, name: str) -> None:
    # A poll interval far beyond the test's patience: only the notification can wake it.
    waiter = lock_backend.other(poll_interval=30.0)
    async with waiter:
        held = await lock_backend.locks.acquire(name, ttl=30)
        assert held is not None
        before = await lock_backend.listeners()
        task = asyncio.create_task(waiter.acquire(name, ttl=10, wait=20))
        # The first refused attempt starts the listener; the release must come after it
        # subscribed, or only the (30 s) poll could find it.
        await eventually(lambda: _more_listeners(lock_backend, before))
        released_at = time.monotonic()
        assert await lock_backend.locks.release(held)
        lease = await asyncio.wait_for(task, 5)
        assert lease is not None and lease.token > held.token
        assert time.monotonic() - released_at < 15  # not the 30 s poll


async def test_a_waiter_takes_over_an_expired_lock(lock_backend: LockBackend, name: str) -> None:
    locks = lock_backend.locks
    held = await locks.acquire(name, ttl=0.3)
    assert held is not None
    t0 = time.monotonic()
    lease = await locks.acquire(name, ttl=10, wait=5)
    assert lease is not None and lease.token > held.token
    assert 0.2 <= time.monotonic() - t0 < 0.3 + 2 * locks.poll_interval + 0.5


# -- across processes


@pytest.mark.timeout(300)
async def test_mutual_exclusion_across_processes(lock_backend: LockBackend, name: str) -> None:
    procs, contenders, rounds = 4, 5, 5
    await lock_backend.race_counter(name)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    args = ["-m", "tests.apps.lockrace", lock_backend.kind, lock_backend.url, name]
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
            # A process's start (imports) on a loaded machine: STARTUP, not a speed.
            line = await asyncio.wait_for(child.stdout.readline(), STARTUP)
            assert line == b"ready\n", line + (await child.stderr.read() if child.stderr else b"")
        outputs = await asyncio.wait_for(
            # A bound for a hung race, not a speed check: 100 turns at load 3 or more
            # on 2 cores took 20 s and more; correctness is read from the marks below.
            asyncio.gather(*(child.communicate(b"go\n") for child in children)),
            180,
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


async def test_hold_renews_while_the_body_runs(lock_backend: LockBackend, name: str) -> None:
    locks = lock_backend.locks

    # A renewal a loaded machine stalls past the ttl loses the lock: proves nothing.
    async def scenario(run: LeaseRun) -> None:
        lock = f"{name}-{run.queue}"
        async with locks.hold(lock, ttl=run.lease) as lease:
            run.start()  # held() stays false past one ttl: any loss tries again, longer
            await asyncio.sleep(run.lease * 10 / 3)  # more than three ttls
            assert await locks.check(lease)
            assert await locks.acquire(lock, ttl=1) is None
        assert not await locks.check(lease)  # released on exit
        assert await locks.acquire(lock, ttl=1) is not None

    await within_lease(scenario, lease=0.3, tries=4)


async def test_hold_cancels_the_body_when_the_lock_is_lost(
    lock_backend: LockBackend, name: str
) -> None:
    locks = lock_backend.locks
    cancelled = asyncio.Event()
    lost_at = 0.0
    with pytest.raises(LeaseLost, match=name):
        async with locks.hold(name, ttl=0.5) as lease:
            thief = await lock_backend.steal(lease)
            lost_at = time.monotonic()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise
    assert cancelled.is_set()
    assert time.monotonic() - lost_at < 30  # a renewal or two, not the body's 60 s
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    stolen = LockLease(name, thief, "thief", 60)
    assert await locks.check(stolen)  # the loser's exit released nothing


async def test_hold_exits_when_a_renewal_drops_the_exits_cancellation(
    lock_backend: LockBackend, name: str
) -> None:
    # Python 3.11's asyncio.wait_for (inside psycopg_pool's getconn) returns its
    # result and drops a cancellation that lands in the same loop iteration
    # (gh-86296). The exit's cancellation of the renewer can be lost that way;
    # the exit must still end, and release the lock.
    locks = lock_backend.locks
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


async def test_hold_rides_out_killed_connections(lock_backend: LockBackend, name: str) -> None:
    locks = lock_backend.locks

    async def scenario(run: LeaseRun) -> None:
        async with locks.hold(f"{name}-{run.queue}", ttl=run.lease) as lease:
            run.start()
            assert await lock_backend.kill_connections() >= 1
            # Two ttls: renewals must have failed, retried and succeeded.
            await asyncio.sleep(2 * run.lease)
            assert await locks.check(lease)

    await within_lease(scenario, lease=0.6, tries=4)


async def test_hold_gives_up_when_renewals_fail_until_expiry(
    lock_backend: LockBackend, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    locks = lock_backend.locks

    async def unreachable(lease: LockLease) -> bool:
        raise BrokerUnavailable("the server is gone")

    t0 = time.monotonic()
    with pytest.raises(LeaseLost, match="no renewal confirmed"):
        async with locks.hold(name, ttl=0.6):
            monkeypatch.setattr(locks, "renew", unreachable)
            await asyncio.sleep(5)
    assert time.monotonic() - t0 < 0.6 + 0.3  # cancelled by the time the lease ran out


async def test_hold_raises_lease_lost_even_if_the_body_swallows_cancel(
    lock_backend: LockBackend, name: str
) -> None:
    locks = lock_backend.locks
    with pytest.raises(LeaseLost):
        async with locks.hold(name, ttl=0.3) as lease:
            await lock_backend.steal(lease)
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                pass  # bad manners, but the block must still not end as if all went well


async def test_hold_refuses_a_held_lock(lock_backend: LockBackend, name: str) -> None:
    locks = lock_backend.locks
    held = await locks.acquire(name, ttl=10)
    assert held is not None
    with pytest.raises(LockNotAcquired, match=name):
        async with locks.hold(name, ttl=1, wait=0.2):
            pytest.fail("entered a held lock")
    assert await locks.check(held)


async def test_hold_releases_when_the_body_raises(lock_backend: LockBackend, name: str) -> None:
    locks = lock_backend.locks
    with pytest.raises(KeyError):
        async with locks.hold(name, ttl=10) as lease:
            raise KeyError("boom")
    assert not await locks.check(lease)
    assert await locks.acquire(name, ttl=1) is not None


async def test_an_outside_cancel_stays_a_cancel(lock_backend: LockBackend, name: str) -> None:
    locks = lock_backend.locks
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
