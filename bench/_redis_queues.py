"""The Redis half of queue_throughput.py: herd's Redis broker, arq, RQ and Celery.

Every ``bench_*`` function enqueues ``jobs`` no-op jobs into an empty Redis database,
drains them with ``concurrency`` jobs in flight, checks that every job succeeded (a
broken run must not print a good number) and returns (enqueue jobs/s, drain jobs/s).

The task functions live here, at module level, because RQ and Celery find a job's
function by its import path (``_redis_queues.rq_noop``) in their worker processes.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

Rates = tuple[float, float]
BENCH = Path(__file__).resolve().parent


def flush(url: str) -> None:
    """Empty every database of the server: each system starts from nothing."""
    with redis.Redis.from_url(url) as r:
        r.flushall()


def _batches(jobs: int, batch: int) -> list[range]:
    return [range(s, min(jobs, s + batch)) for s in range(0, jobs, batch)]


# --------------------------------------------------------------------------- herd


async def bench_herd(url: str, jobs: int, concurrency: int, batch: int) -> Rates:
    from herd import App, Worker
    from herd.queue.redis import RedisBroker

    logging.getLogger("herd.redis").setLevel(logging.ERROR)  # no AOF here, on purpose
    app = App(broker=RedisBroker(url))

    @app.task(name="noop")
    async def noop(payload: object) -> None:
        return None

    async with app:
        t0 = time.perf_counter()
        for part in _batches(jobs, batch):
            await app.enqueue_many("noop", [{"i": i} for i in part])
        enqueue_s = time.perf_counter() - t0
        worker = Worker(
            app,
            concurrency=concurrency,
            poll_interval=0.05,
            stop_when_idle=True,
            install_signal_handlers=False,
        )
        t0 = time.perf_counter()
        stats = await worker.run()
        drain_s = time.perf_counter() - t0
        assert stats.succeeded == jobs and stats.claimed == jobs, stats
    return jobs / enqueue_s, jobs / drain_s


# --------------------------------------------------------------------------- arq


async def arq_noop(ctx: dict[str, Any], i: int) -> None:
    return None


async def bench_arq(url: str, jobs: int, concurrency: int, batch: int) -> Rates:
    from arq import create_pool
    from arq.connections import RedisSettings
    from arq.worker import Worker as ArqWorker
    from arq.worker import func

    settings = RedisSettings.from_dsn(url)
    pool = await create_pool(settings)
    try:
        # arq has no batch enqueue: one WATCH/MULTI/EXEC transaction per job. A batch's
        # jobs go out concurrently, so the round trips overlap as far as arq lets them.
        t0 = time.perf_counter()
        for part in _batches(jobs, batch):
            done = await asyncio.gather(*(pool.enqueue_job("noop", i) for i in part))
            assert all(j is not None for j in done)
        enqueue_s = time.perf_counter() - t0
        worker = ArqWorker(
            functions=[func(arq_noop, name="noop")],
            redis_pool=pool,
            burst=True,
            max_jobs=concurrency,
            poll_delay=0.05,  # herd polls every 0.05 s here too (arq's default: 0.5 s)
            handle_signals=False,
            log_results=False,  # no per-job log line (herd writes none either)
        )
        t0 = time.perf_counter()
        await worker.main()
        drain_s = time.perf_counter() - t0
        assert worker.jobs_complete == jobs and worker.jobs_failed == 0, worker
        assert await pool.zcard("arq:queue") == 0
    finally:
        await pool.aclose()
    return jobs / enqueue_s, jobs / drain_s


# --------------------------------------------------------------------------- RQ


def rq_noop(i: int) -> None:
    return None


def _rq_worker(url: str, ready: Any) -> None:
    """One RQ SimpleWorker process: set up, wait for the start signal, work in burst mode."""
    from rq import Queue, SimpleWorker

    logging.getLogger("rq").setLevel(logging.WARNING)
    conn = redis.Redis.from_url(url)
    worker = SimpleWorker([Queue("bench", connection=conn)], connection=conn)
    ready.wait()
    worker.work(burst=True, logging_level="WARNING")


def bench_rq(url: str, jobs: int, concurrency: int, batch: int, processes: int) -> Rates:
    """``processes`` SimpleWorker processes (RQ runs one job at a time per worker)."""
    from rq import Queue
    from rq.registry import FailedJobRegistry, FinishedJobRegistry

    conn = redis.Redis.from_url(url)
    queue = Queue("bench", connection=conn)
    t0 = time.perf_counter()
    for part in _batches(jobs, batch):
        with conn.pipeline() as pipe:
            queue.enqueue_many([Queue.prepare_data(rq_noop, (i,)) for i in part], pipeline=pipe)
            pipe.execute()
    enqueue_s = time.perf_counter() - t0
    assert queue.count == jobs, queue.count

    # Spawned, set up and imported before the clock starts; then all start at once.
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Barrier(processes + 1)
    procs = [ctx.Process(target=_rq_worker, args=(url, ready)) for _ in range(processes)]
    for p in procs:
        p.start()
    ready.wait(timeout=60)
    t0 = time.perf_counter()
    for p in procs:
        p.join()
    drain_s = time.perf_counter() - t0
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    finished = FinishedJobRegistry(queue=queue).count
    failed = FailedJobRegistry(queue=queue).count
    assert finished == jobs and failed == 0 and queue.count == 0, (finished, failed, queue.count)
    conn.close()
    return jobs / enqueue_s, jobs / drain_s


# --------------------------------------------------------------------------- Celery


def celery_app(url: str) -> Any:
    """Redis as broker (db 0) and result backend (db 1, so DBSIZE counts the results)."""
    from celery import Celery

    app = Celery("bench", broker=url, backend=url.rsplit("/", 1)[0] + "/1")
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        task_ignore_result=False,
        broker_connection_retry_on_startup=True,
    )

    @app.task(name="noop")
    def noop(i: int) -> None:
        return None

    return app


def bench_celery(url: str, jobs: int, concurrency: int, batch: int, pool: str) -> Rates:
    """A ``celery worker`` process with ``concurrency`` slots of ``pool`` (prefork, threads).

    The worker starts (outside the clock) consuming from an idle queue; once it answers
    a ping, it is told to consume the loaded queue and the clock runs until the result
    backend holds every job's result.
    """
    app = celery_app(url)
    noop = app.tasks["noop"]
    t0 = time.perf_counter()
    with app.producer_or_acquire() as producer:
        for part in _batches(jobs, batch):
            for i in part:
                noop.apply_async((i,), queue="bench", producer=producer)
    enqueue_s = time.perf_counter() - t0

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BENCH), *sys.path]))
    cmd = [
        sys.executable, "-m", "celery", "-A", "_redis_queues:celery_worker_app",
        "worker", "--pool", pool, "--concurrency", str(concurrency), "--queues", "idle",
        "--loglevel", "WARNING", "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--prefetch-multiplier", "4",
    ]  # fmt: skip
    env["BENCH_CELERY_URL"] = url
    log_path = Path(tempfile.mkdtemp(prefix="herd-bench-celery-")) / "worker.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=BENCH, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not app.control.ping(timeout=0.5):
            assert proc.poll() is None and time.monotonic() < deadline, f"see {log_path}"
        results = redis.Redis.from_url(url.rsplit("/", 1)[0] + "/1")
        t0 = time.perf_counter()
        app.control.add_consumer("bench", reply=False)
        while results.dbsize() < jobs:
            assert proc.poll() is None, f"celery worker died, see {log_path}"
            time.sleep(0.005)
        drain_s = time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    keys = list(results.scan_iter("celery-task-meta-*", count=1000))
    ok = sum(1 for v in (results.mget(keys) if keys else []) if b'"status": "SUCCESS"' in v)
    results.close()
    app.close()
    assert ok == jobs, (ok, len(keys), f"see {log_path}")
    shutil.rmtree(log_path.parent, ignore_errors=True)
    return jobs / enqueue_s, jobs / drain_s


if "BENCH_CELERY_URL" in os.environ:  # imported by the celery worker process
    celery_worker_app = celery_app(os.environ["BENCH_CELERY_URL"])
