"""Small helpers shared by the tests: polling with a deadline instead of sleeping."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg
import redis

from herd.queue.base import NewJob
from herd.testing.fleet import wait_until

T = TypeVar("T")


def job(task: str = "t", payload: object = None, **kw: object) -> NewJob:
    kw.setdefault("lease_seconds", 30.0)
    return NewJob(task=task, payload=payload if payload is not None else {}, **kw)  # type: ignore[arg-type]


async def eventually(
    probe: Callable[[], Awaitable[T]], *, timeout: float = 10.0, interval: float = 0.02
) -> T:
    """Call ``probe`` until it returns something truthy; fail after ``timeout`` seconds."""
    return await wait_until(probe, timeout, interval=interval)


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
