"""The newer PostgreSQL peers of ``queue_throughput.py``: pgqueuer and DBOS queues.

Each function enqueues ``jobs`` no-op jobs on a fresh database of the shared embedded
server, then drains them, and returns (enqueue jobs/s, drain jobs/s) after checking
that every job ran exactly as asked. Each peer runs at its own recommended settings:

- **pgqueuer**: ``AsyncpgDriver`` on one asyncpg connection (its documented setup), the
  batch enqueue (lists of entrypoints and payloads, one statement per batch), and
  ``QueueManager.run(mode=drain)`` at its defaults (dequeue batches of 10, no cap on
  jobs in flight), or held to ``in_flight`` jobs with ``max_concurrent_tasks`` (which
  pgqueuer requires to be at least twice the dequeue batch: batches of half of it).
- **DBOS** Transact: a queue registered with ``worker_concurrency`` (its per-process
  cap) and a no-op ``@DBOS.workflow``. A DBOS queue is polled, not woken: at its
  default ``polling_interval_sec`` of 1 s it starts at most ``worker_concurrency``
  workflows a second, so it polls every 0.05 s here, as herd and Procrastinate do.
  DBOS has no batch enqueue: ``DBOSClient.enqueue`` (one transaction per workflow) is
  issued from 5 threads (its client's pool holds 5 connections), before
  ``DBOS.launch()`` starts the queue's worker, so that the drain is timed alone, until
  every workflow reads ``SUCCESS``.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import psycopg


def _asyncpg_dsn(url: str) -> str:
    # herd's URLs name the server's socket folder in ?host=...; asyncpg reads it there too.
    return url


async def bench_pgqueuer(
    url: str, jobs: int, batch: int, in_flight: int | None
) -> tuple[float, float]:
    """``in_flight`` None: pgqueuer's defaults; else ``max_concurrent_tasks=in_flight``."""
    import asyncpg
    from pgqueuer import AsyncpgDriver, QueueManager
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    conn = await asyncpg.connect(_asyncpg_dsn(url))
    try:
        driver = AsyncpgDriver(conn)
        queries = Queries(driver)
        await queries.install()
        t0 = time.perf_counter()
        for start in range(0, jobs, batch):
            n = min(jobs, start + batch) - start
            await queries.enqueue(
                ["noop"] * n, [str(i).encode() for i in range(start, start + n)], [0] * n
            )
        enqueue_s = time.perf_counter() - t0

        qm = QueueManager(queries)
        ran = 0

        @qm.entrypoint("noop")
        async def noop(job: Job) -> None:
            nonlocal ran
            ran += 1

        options = {} if in_flight is None else {
            "max_concurrent_tasks": in_flight, "batch_size": max(1, in_flight // 2)
        }  # fmt: skip
        t0 = time.perf_counter()
        await qm.run(mode=QueueExecutionMode.drain, dequeue_timeout=timedelta(seconds=1), **options)
        drain_s = time.perf_counter() - t0
    finally:
        await conn.close()
    with psycopg.connect(url) as check:
        left = check.execute("SELECT count(*) FROM pgqueuer").fetchone()
    assert ran == jobs and left is not None and left[0] == 0, (ran, left)
    return jobs / enqueue_s, jobs / drain_s


def _dbos_app(db: str, concurrency: int, poll: float, ran: list[int]) -> None:
    """A DBOS instance with the no-op workflow and the queue, launched."""
    from dbos import DBOS

    DBOS(config={"name": "herd-bench", "system_database_url": db, "log_level": "WARNING"})
    lock = threading.Lock()

    @DBOS.workflow(name="noop")
    def noop(i: int) -> None:
        with lock:
            ran[0] += 1

    DBOS.launch()
    # In the system database since DBOS 3: registered once launched.
    DBOS.register_queue("bench", worker_concurrency=concurrency, polling_interval_sec=poll)


def bench_dbos(
    url: str, jobs: int, concurrency: int, poll: float = 0.05, enqueuers: int = 5
) -> tuple[float, float]:
    from dbos import DBOS, DBOSClient

    db = url.replace("postgresql://", "postgresql+psycopg://", 1)
    ran = [0]
    # A first launch creates DBOS's tables and the queue; the jobs are enqueued while no
    # executor runs, so that the drain, by the second launch, is timed alone.
    _dbos_app(db, concurrency, poll, ran)
    DBOS.destroy(destroy_registry=True)
    client = DBOSClient(system_database_url=db)
    try:
        t0 = time.perf_counter()
        options: Any = {"queue_name": "bench", "workflow_name": "noop"}
        with ThreadPoolExecutor(enqueuers) as pool:
            list(pool.map(lambda i: client.enqueue(options, i), range(jobs)))
        enqueue_s = time.perf_counter() - t0
    finally:
        client.destroy()
    t0 = time.perf_counter()
    try:
        _dbos_app(db, concurrency, poll, ran)
        with psycopg.connect(url, autocommit=True) as conn:
            while True:
                row = conn.execute(
                    "SELECT count(*) FROM dbos.workflow_status"
                    " WHERE queue_name = 'bench' AND status = 'SUCCESS'"
                ).fetchone()
                assert row is not None
                if row[0] == jobs:
                    break
                time.sleep(0.05)
        drain_s = time.perf_counter() - t0
    finally:
        DBOS.destroy(destroy_registry=True)
    assert ran[0] == jobs, ran
    return jobs / enqueue_s, jobs / drain_s
