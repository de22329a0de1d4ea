"""Small helpers shared by the tests: polling with a deadline instead of sleeping."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import psycopg
import redis

from herd.errors import LeaseLost
from herd.queue.base import NewJob
from herd.testing.fleet import wait_until

T = TypeVar("T")

# Seconds a test waits for a process it started (a server, `herd serve`, a worker) to be
# ready: a safety net, not a measure, long enough for a 2-core machine at a load of 8
# and inside pytest's 120 s timeout. A process that exits fails the wait at once.
STARTUP = 90.0


def job(task: str = "t", payload: object = None, **kw: object) -> NewJob:
    kw.setdefault("lease_seconds", 30.0)
    return NewJob(task=task, payload=payload if payload is not None else {}, **kw)  # type: ignore[arg-type]


async def eventually(
    probe: Callable[[], Awaitable[T]], *, timeout: float = 10.0, interval: float = 0.02
) -> T:
    """Call ``probe`` until it returns something truthy; fail after ``timeout`` seconds."""
    return await wait_until(probe, timeout, interval=interval)


class LeaseRun:
    """One try of a scenario whose steps need a short lease to hold (see ``within_lease``):
    its lease length, a queue of its own, and when the lease that must hold was asked."""

    def __init__(self, lease: float, queue: str) -> None:
        self.lease, self.queue = lease, queue
        self.since: float | None = None

    def start(self, at: float | None = None) -> None:
        """Call just before the claim (or renewal) whose lease the next steps need; ``at``:
        when that claim or renewal was sent, if earlier."""
        self.since = time.monotonic() if at is None else at

    def held(self) -> bool:
        """Every step so far ran inside that lease (the store started it after ``start``)."""
        return self.since is None or time.monotonic() - self.since < self.lease


async def within_lease(
    scenario: Callable[[LeaseRun], Awaitable[None]], *, lease: float = 0.3, tries: int = 6
) -> None:
    """Run ``scenario``, which lets a short lease run out and then needs a lease of the
    same length to hold for a few steps. A failure after that lease could have run out
    (a loaded machine) proves nothing: the scenario runs again, in a queue of its own,
    with a lease twice as long; a failure inside the lease is raised."""
    for n in range(tries):
        run = LeaseRun(lease * 2**n, f"lease-try-{n}")
        try:
            await scenario(run)
            return
        # ValueError: a claim unpacked, found empty; LeaseLost: a lock's hold() gave up.
        except (AssertionError, ValueError, LeaseLost):
            if run.held():
                raise
    raise AssertionError(f"the steps outlasted a lease of up to {lease * 2 ** (tries - 1):g} s")


def eventually_sync(probe: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.02) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value {value!r})")
        time.sleep(interval)


def priced(monkeypatch, tmp_path, *models: str) -> None:  # type: ignore[no-untyped-def]
    """Price ``models`` (HERD_PRICES): a budget needs a price, or the submission is refused."""
    import json

    path = tmp_path / "prices.json"
    path.write_text(json.dumps({m: {"input": 1.0, "output": 2.0} for m in models}))
    monkeypatch.setenv("HERD_PRICES", str(path))


def truncate(url: str) -> None:
    """Empty the job table of the PostgreSQL database at ``url``."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE herd_jobs RESTART IDENTITY")


def flush_redis(url: str) -> None:
    """Empty the Redis database at ``url``."""
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()


@contextlib.contextmanager
def fresh_database(server_url: str, name: str, **conninfo: str) -> Iterator[str]:
    """An empty database ``name`` on the server of ``server_url`` (dropped before and
    after); yields its URL, with ``conninfo`` (a password, say) set in it."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    info = psycopg.conninfo.conninfo_to_dict(server_url)
    try:
        yield psycopg.conninfo.make_conninfo(**{**info, "dbname": name, **conninfo})
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def own_connections(url: str) -> tuple[str, str]:
    """``url`` with an application name of its own, and that name: the connections a
    test drops (``drop_connections``) are then its own only, not a PgBouncer's or
    another test's on the same database."""
    import uuid

    tag = f"herd-drop-{uuid.uuid4().hex[:8]}"
    return f"{url}{'&' if '?' in url else '?'}application_name={tag}", tag


def drop_connections(admin_url: str, tag: str) -> None:
    """The server ends every connection named ``tag``, as a restart would."""
    with psycopg.connect(admin_url, autocommit=True) as admin:
        dropped = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (tag,),
        ).fetchall()
    assert dropped and all(ok for (ok,) in dropped)


def count_checkout_checks(monkeypatch) -> list[str]:  # type: ignore[no-untyped-def]
    """A list that grows by one for each check of a connection on its checkout from a
    pool (AsyncConnectionPool.check_connection sends an empty query). Connections stay
    fresh for the whole test: on a loaded machine one left idle could age past the 1 s
    window and be checked, which is the window working, not a read skipping the check."""
    checks: list[str] = []
    execute = psycopg.AsyncConnection.execute

    async def counting(self, query, params=None, **kw):  # type: ignore[no-untyped-def]
        if query == "":
            checks.append(query)
        return await execute(self, query, params, **kw)

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", counting)
    monkeypatch.setattr("herd.db.postgres.FRESH", 60.0)
    return checks
