"""Contract: a killed worker's jobs are taken over at once; a frozen one keeps them.

Real worker processes: SIGKILL closes the process's sockets, so
the store drops its liveness mark and a claim takes its job over well before the
30 s lease would end; SIGSTOP leaves the sockets open, so the job waits for the
lease to expire. The claimer here is the test's own broker, which holds no mark.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from herd import App
from herd.errors import BrokerError
from herd.queue.base import JobStatus
from herd.testing.fleet import Fleet, worker_env
from herd.worker import Worker
from tests.apps.crashapp import app as crash_app
from tests.helpers import eventually, job

ROOT = Path(__file__).resolve().parents[2]
QUEUE = "takeover"
# A worker process as `herd worker` runs it, without the CLI's imports (seconds on a
# busy machine).
WORKER = f"""
import asyncio
from herd.worker import Worker
from tests.apps.crashapp import app
asyncio.run(Worker(app, queues=["{QUEUE}"], concurrency=1, poll_interval=0.2).run())
"""


@pytest.fixture
def fleet(broker, request, tmp_path) -> Iterator[Fleet]:
    """Worker processes on the broker's store (through PgBouncer with the direct URL
    for the mark); each is killed at the end, even if stopped."""
    store = {"database_url" if broker.name == "postgres" else "redis_url": broker.url}
    if broker.name == "postgres" and broker.url != request.getfixturevalue("pg_url"):
        store["HERD_DATABASE_DIRECT_URL"] = request.getfixturevalue("pg_url")  # PgBouncer
    env = worker_env(broker=broker.name, pythonpath=[ROOT], **store)
    with Fleet([sys.executable, "-c", WORKER], env, logs=tmp_path, cwd=ROOT) as workers:
        yield workers


async def _running_in(broker, pid: int, lease_seconds: float):
    """Enqueue a long job and wait until worker ``pid`` runs it."""
    (r,) = await broker.enqueue(
        [job("crash.sleep", {"seconds": 600}, queue=QUEUE, lease_seconds=lease_seconds)]
    )

    async def held():
        j = await broker.get_job(r.job_id)
        return j if j.status == JobStatus.PROCESSING and f":{pid}:" in j.lease_owner else None

    return await eventually(held, timeout=30)


async def test_a_killed_workers_job_is_taken_over_long_before_its_lease_ends(broker, fleet):
    (worker,) = fleet.start()
    held = await _running_in(broker, worker.pid, lease_seconds=30)
    fleet.kill(worker.pid)
    killed = time.monotonic()

    async def rescued():
        return await broker.claim([QUEUE], "rescuer", 1)

    (lease,) = await eventually(rescued, timeout=15, interval=0.05)
    assert time.monotonic() - killed < 15  # the 30 s lease had 15 s or more to run
    assert lease.job_id == held.id and lease.token > held.lease_token and lease.stalls == 1
    taken = await broker.get_job(held.id)
    assert taken.lease_owner == "rescuer"
    assert taken.last_error == f"worker {held.lease_owner} died holding the lease"


async def test_a_frozen_worker_keeps_its_job_until_the_lease_expires(broker, fleet):
    (worker,) = fleet.start()
    held = await _running_in(broker, worker.pid, lease_seconds=3)
    fleet.freeze(worker.pid)
    # Read after the stop: no renewal can land later, so this expiry is the last one.
    frozen = await broker.get_job(held.id)

    async def rescued():
        return await broker.claim([QUEUE], "rescuer", 1)

    (lease,) = await eventually(rescued, timeout=10, interval=0.05)
    taken = await broker.get_job(held.id)
    # Claimed by the store's clock no earlier than the frozen owner's lease ran out.
    assert taken.lease_expires_at is not None and frozen.lease_expires_at is not None
    claimed_at = taken.lease_expires_at.timestamp() - lease.lease_seconds
    assert claimed_at >= frozen.lease_expires_at.timestamp() - 0.01
    assert taken.last_error == f"lease expired while held by {held.lease_owner}"
    assert lease.stalls == 1


def _without_session(broker, request) -> bool:
    """PostgreSQL through PgBouncer with no direct URL: no session to hold a mark in."""
    return broker.name == "postgres" and broker.url != request.getfixturevalue("pg_url")


async def test_a_mark_is_one_owners_and_dropped_when_its_worker_stops(broker, request):
    if _without_session(broker, request):
        assert await broker.hold_liveness("w1") is False  # lease expiry only, and a warning
        return
    app = App(broker=broker)
    app.include(crash_app)
    worker = Worker(app, queues=[QUEUE], concurrency=1, install_signal_handlers=False)
    # Another process (here another broker) cannot hold the mark of a running worker.
    other = type(broker)(broker.url)
    await other.open()
    try:
        running = asyncio.create_task(worker.run())
        # Once it runs a job it holds its mark (taken before its first claim).
        (r,) = await broker.enqueue([job("crash.sleep", {"seconds": 600}, queue=QUEUE)])

        async def started():
            return (await broker.get_job(r.job_id)).lease_owner == worker.name

        await eventually(started, timeout=10)
        with pytest.raises(BrokerError, match="unique per process"):
            await other.hold_liveness(worker.name)
        worker.stop(immediate=True)
        await asyncio.wait_for(running, 10)
        # Stopped: the mark is free again.
        assert await other.hold_liveness(worker.name) is True
    finally:
        await other.close()


def _mark_holders(broker, url: str, owner: str) -> list[int]:
    """The server's ids of the sessions (PostgreSQL) or clients (Redis) holding the mark."""
    if broker.name == "postgres":
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted"
                " AND ((classid::int8 << 32) | objid::int8) = hashtextextended(%s, 0)",
                (owner,),
            ).fetchall()
        return [int(pid) for (pid,) in rows]
    import redis

    from herd.db.redis import mark_name

    with redis.Redis.from_url(url, decode_responses=True) as client:
        return [int(c["id"]) for c in client.client_list() if c["name"] == mark_name(owner)]


def _drop(broker, url: str, holder: int) -> None:
    if broker.name == "postgres":
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (holder,))
    else:
        import redis

        with redis.Redis.from_url(url) as client:
            client.client_kill_filter(_id=holder)


async def test_a_mark_whose_connection_the_server_dropped_is_taken_again(broker, request):
    if _without_session(broker, request):
        pytest.skip("no session to hold a mark in through PgBouncer without a direct URL")
    url = request.getfixturevalue("pg_url") if broker.name == "postgres" else broker.url
    assert await broker.hold_liveness("w-drop") is True
    (first,) = _mark_holders(broker, url, "w-drop")
    _drop(broker, url, first)

    async def retaken():
        holders = _mark_holders(broker, url, "w-drop")
        return holders if holders and holders != [first] else None

    (again,) = await eventually(retaken, timeout=10)
    assert again != first
    assert await broker.hold_liveness("w-drop") is True  # back, and in use for claims
    # A job claimed now records the new mark (Redis: the new CLIENT ID, not the dropped
    # one): it stands while the mark does, and once the mark goes, as when the process
    # dies, the job is free at once, not after 30 s.
    (r,) = await broker.enqueue([job(queue=QUEUE)])
    (lease,) = await eventually(lambda: broker.claim([QUEUE], "w-drop", 1), timeout=5)
    other = type(broker)(broker.url)
    await other.open()
    try:
        assert await other.claim([QUEUE], "rescuer", 1) == []  # a new broker looks at once
        await broker.release_liveness("w-drop")
        (taken,) = await eventually(lambda: other.claim([QUEUE], "rescuer", 1), timeout=5)
        assert taken.job_id == r.job_id and taken.token > lease.token
    finally:
        await other.close()
