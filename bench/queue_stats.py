"""stats() and /overview on PostgreSQL in a backlog and right after a drain (issue 34).

One embedded PostgreSQL, a fresh database per phase, autovacuum off on herd_jobs (the
state a dashboard meets before autovacuum has come by):

a. **empty store**: ``app.stats()`` and ``GET /overview`` (herd's FastAPI app in this
   process, over httpx's ASGI transport), ``--calls`` times each;
b. **backlog**: ``--pending`` jobs waiting (``enqueue_many``), timed the same way; then
   the claim's plan (EXPLAIN of the claim statement's ready scan) with those
   statistics and after ``ANALYZE``: it must walk ``herd_jobs_ready``, never sort;
c. **just after a drain**: ``--finished`` jobs enqueued, claimed and completed through
   the broker's own statements (batches of 1,000), then timed at once.

Goals: (b) at most 2 ms; (c) within 3x the empty store's, or 2 ms more. The median of
the calls is compared (a dashboard polls; one slow call is not the point), the p95 is
printed too. ``--quick``: 15,000 pending, 30,000 finished.

    python bench/queue_stats.py [--pending 150000] [--finished 300000] [--calls 30]
        [--quick] [--summary PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import _summary
import httpx
import psycopg

from herd import App
from herd.api.app import create_app
from herd.embedded import embedded_server
from herd.queue.base import Completion, NewJob
from herd.queue.postgres import PostgresBroker

CLAIM_SCAN = (
    "EXPLAIN SELECT id, priority FROM herd_jobs"
    " WHERE status = 'pending' AND queue = 'default' AND run_at <= now()"
    " ORDER BY priority DESC, id LIMIT 10 FOR UPDATE SKIP LOCKED"
)


def fresh_database(admin_url: str, name: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    return admin_url.replace("/herd?", f"/{name}?", 1)


async def timed(call: Callable[[], Awaitable[Any]], n: int) -> tuple[float, float]:
    """(median, p95) milliseconds of ``n`` sequential calls, after one to warm up."""
    await call()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call()
        out.append((time.perf_counter() - t0) * 1000)
    return statistics.median(out), sorted(out)[max(0, math.ceil(0.95 * n) - 1)]


async def measure(url: str, calls: int) -> dict[str, tuple[float, float]]:
    app = App(database_url=url)
    async with app:
        transport = httpx.ASGITransport(app=create_app(app), client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:

            async def overview() -> None:
                r = await http.get("/overview")
                if r.status_code != 200:
                    raise RuntimeError(f"/overview answered {r.status_code}: {r.text[:200]}")

            stats = await timed(app.stats, calls)
            return {"stats()": stats, "/overview": await timed(overview, calls)}


async def fill(url: str, pending: int, finished: int) -> None:
    broker = PostgresBroker(url)
    await broker.open()
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER TABLE herd_jobs SET (autovacuum_enabled = off)")
        for start in range(0, finished + pending, 1000):
            size = min(1000, finished + pending - start)
            jobs = [NewJob(task="noop", payload={"i": start + k}) for k in range(size)]
            await broker.enqueue(jobs)
            if start < finished:
                leases = await broker.claim(["default"], "bench", size)
                done = await broker.complete_if_leased([Completion(x, None) for x in leases])
                if len(leases) != size or not all(done):
                    raise RuntimeError(f"{len(leases)} claimed, {sum(done)} done of {size}")
    finally:
        await broker.close()


def claim_plan(url: str) -> str:
    with psycopg.connect(url) as conn:
        rows = conn.execute(CLAIM_SCAN).fetchall()
    scans = [r[0].strip() for r in rows if "Scan" in r[0] or "Sort" in r[0]]
    return "; ".join(s.split("  (")[0].lstrip("-> ") for s in scans)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=150_000)
    parser.add_argument("--finished", type=int, default=300_000)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="15,000 pending, 30,000 finished")
    parser.add_argument("--summary", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()
    if args.quick:
        args.pending, args.finished, args.calls = 15_000, 30_000, 15
    if min(args.pending, args.finished, args.calls) < 1:
        parser.error("--pending, --finished and --calls take positive numbers")

    home = Path(tempfile.mkdtemp(prefix="herd-bench-stats-"))
    server = embedded_server(home)
    admin = server.acquire()
    try:
        empty = asyncio.run(measure(fresh_database(admin, "bench_empty"), args.calls))
        url = fresh_database(admin, "bench_backlog")
        asyncio.run(fill(url, args.pending, 0))
        plans = {"stale statistics": claim_plan(url)}
        backlog = asyncio.run(measure(url, args.calls))
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ANALYZE herd_jobs")
        plans["after ANALYZE"] = claim_plan(url)
        url = fresh_database(admin, "bench_drained")
        print(f"draining {args.finished:,} jobs", file=sys.stderr, flush=True)
        asyncio.run(fill(url, 0, args.finished))
        drained = asyncio.run(measure(url, args.calls))
    finally:
        server.release()
        shutil.rmtree(home, ignore_errors=True)

    print(
        f"stats() and /overview, PostgreSQL, median (p95) of {args.calls} calls, ms;"
        " autovacuum off on herd_jobs"
    )
    phases = {
        "empty store": empty,
        f"{args.pending:,} pending": backlog,
        f"just after {args.finished:,} finished": drained,
    }
    print(f"{'':34}{'stats()':>16}{'/overview':>16}")
    for name, figures in phases.items():
        cells = "".join(f"{f'{m:.2f} ({p:.2f})':>16}" for m, p in figures.values())
        print(f"{name:34}{cells}")
    for when, plan in plans.items():
        print(f"claim's ready scan, {when}: {plan}")
    rows = []
    for read in ("stats()", "/overview"):
        goal_after = max(3 * empty[read][0], empty[read][0] + 2.0)
        rows.append(
            _summary.row(
                f"{read} at {args.pending:,} pending (vs the 2 ms goal)",
                backlog[read][0], 2.0, "ms", "lower",
            )
        )  # fmt: skip
        rows.append(
            _summary.row(
                f"{read} just after {args.finished:,} finished (vs 3x empty or +2 ms)",
                drained[read][0], goal_after, "ms", "lower",
            )
        )  # fmt: skip
    sorts = any("Sort" in plan for plan in plans.values())
    _summary.write(
        args.summary,
        "queue_stats",
        "the goals of issue 34",
        rows,
        [
            f"median of {args.calls} calls; empty store: stats() {empty['stats()'][0]:.2f} ms,"
            f" /overview {empty['/overview'][0]:.2f} ms; autovacuum off on herd_jobs",
            "claim's ready scan: "
            + ("SORTS (regression)" if sorts else "herd_jobs_ready, no sort"),
        ],
    )


if __name__ == "__main__":
    main()
