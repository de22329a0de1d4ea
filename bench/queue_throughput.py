"""Queue throughput: herd against Procrastinate on the same embedded PostgreSQL, one run.

Enqueue N no-op jobs in batches, then drain them with the same number of worker
coroutines (one process each), and print jobs/s and the ratio. Also counts the SQL
statements one heartbeat tick sends for 1,000 leases held by one worker process.

    pip install -e ".[bench]" && python bench/queue_throughput.py [--jobs 10000] [--concurrency 10]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from herd import App, Worker
from herd.embedded import embedded_server

log = logging.getLogger("bench")


def fresh_database(admin_url: str, name: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    return admin_url.replace("/herd?", f"/{name}?", 1)


async def bench_herd(url: str, jobs: int, concurrency: int, batch: int) -> tuple[float, float]:
    app = App(database_url=url)

    @app.task(name="noop")
    async def noop(payload: object) -> None:
        return None

    async with app:
        t0 = time.perf_counter()
        for start in range(0, jobs, batch):
            await app.enqueue_many(
                "noop", [{"i": i} for i in range(start, min(jobs, start + batch))]
            )
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
        assert stats.succeeded == jobs, stats
    return jobs / enqueue_s, jobs / drain_s


async def bench_procrastinate(
    url: str, jobs: int, concurrency: int, batch: int
) -> tuple[float, float]:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="noop")
    async def noop(i: int) -> None:
        return None

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        t0 = time.perf_counter()
        for start in range(0, jobs, batch):
            await noop.batch_defer_async(
                *({"i": i} for i in range(start, min(jobs, start + batch)))
            )
        enqueue_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        await app.run_worker_async(
            concurrency=concurrency,
            wait=False,
            install_signal_handlers=False,
            fetch_job_polling_interval=0.05,
            listen_notify=True,
        )
        drain_s = time.perf_counter() - t0
        async with app.connector.pool.connection() as conn:  # type: ignore[attr-defined]
            cur = await conn.execute(
                "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
            )
            done = (await cur.fetchone())[0]
        assert done == jobs, done
    return jobs / enqueue_s, jobs / drain_s


async def heartbeat_statements(url: str, leases: int) -> tuple[float, int]:
    """SQL statements the heartbeat sends per tick while one process holds ``leases`` jobs."""
    sent: list[str] = []
    original = psycopg.AsyncConnection.execute

    async def counting_execute(self, query, params=None, **kw):  # type: ignore[no-untyped-def]
        if (
            asyncio.current_task() is not None
            and asyncio.current_task().get_name() == "herd-heartbeat"
        ):
            sent.append(str(query)[:40])
        return await original(self, query, params, **kw)

    app = App(database_url=url)
    release = asyncio.Event()

    @app.task(name="hold", lease_seconds=0.9)
    async def hold(payload: object) -> None:
        await release.wait()

    async with app:
        await app.enqueue_many("hold", [{}] * leases)
        worker = Worker(app, concurrency=leases, poll_interval=0.05, install_signal_handlers=False)
        run = asyncio.create_task(worker.run())
        while worker.stats.claimed < leases:
            await asyncio.sleep(0.05)
        psycopg.AsyncConnection.execute = counting_execute  # type: ignore[method-assign]
        ticks_before = worker.stats.heartbeats
        await asyncio.sleep(3.0)  # ~10 ticks at a 0.3 s interval
        psycopg.AsyncConnection.execute = original  # type: ignore[method-assign]
        ticks = worker.stats.heartbeats - ticks_before
        release.set()
        worker.stop()
        await run
        assert worker.stats.lost == 0, worker.stats
    return len(sent) / max(1, ticks), ticks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    home = Path(tempfile.mkdtemp(prefix="herd-bench-"))
    admin = embedded_server(home).acquire()
    herd_rates, proc_rates = [], []
    for r in range(args.rounds):
        h = asyncio.run(
            bench_herd(
                fresh_database(admin, f"bench_herd_{r}"), args.jobs, args.concurrency, args.batch
            )
        )
        p = asyncio.run(
            bench_procrastinate(
                fresh_database(admin, f"bench_proc_{r}"), args.jobs, args.concurrency, args.batch
            )
        )
        herd_rates.append(h)
        proc_rates.append(p)
        print(
            f"round {r + 1}: herd enqueue {h[0]:,.0f}/s drain {h[1]:,.0f}/s | "
            f"procrastinate enqueue {p[0]:,.0f}/s drain {p[1]:,.0f}/s",
            file=sys.stderr,
        )
    per_tick, ticks = asyncio.run(heartbeat_statements(fresh_database(admin, "bench_hb"), 1000))

    hd = statistics.median(x[1] for x in herd_rates)
    pd = statistics.median(x[1] for x in proc_rates)
    he = statistics.median(x[0] for x in herd_rates)
    pe = statistics.median(x[0] for x in proc_rates)
    print(
        f"queue throughput: {args.jobs:,} no-op jobs, concurrency {args.concurrency}, "
        f"embedded PostgreSQL, {args.rounds} round(s), medians"
    )
    print(f"{'':14}{'enqueue jobs/s':>16}{'drain jobs/s':>16}")
    print(f"{'herd':14}{he:>16,.0f}{hd:>16,.0f}")
    print(f"{'procrastinate':14}{pe:>16,.0f}{pd:>16,.0f}")
    print(f"{'ratio':14}{he / pe:>15.1f}x{hd / pd:>15.1f}x")
    print(f"heartbeat: {per_tick:.2f} SQL statements per tick for 1,000 leases ({ticks} ticks)")


if __name__ == "__main__":
    main()
