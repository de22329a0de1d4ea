"""The status read of an evaluation batch with a long backlog: ``batch_status`` (what
``herd eval status``, ``GET /evals/{batch}`` and the dashboard's batch card call).

One embedded PostgreSQL (or ``--url``), a fresh database: ``--documents`` documents
submitted to one batch with no worker running, so every one waits; a batch of
``--small`` documents beside it. Each batch's status is then read ``--calls`` times
(after one to warm up); printed: the median and p95 in milliseconds, and the jobs one
read fetched from the broker. The provider is never called (no worker runs).

Run it with another checkout's herd first on the path to compare (the before):

    PYTHONPATH=/path/to/other/checkout python bench/status_read.py
    python bench/status_read.py [--documents 20000] [--small 100] [--calls 10]
        [--broker postgres|redis --redis-url URL] [--url URL] [--summary PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _summary
import psycopg

import herd
from herd import App
from herd.embedded import embedded_server
from herd.llm import eval as evaluate
from herd.llm.eval import EvalSpec, submit_texts

SPEC = EvalSpec(model="sim-1", system="Rate the paper from 1 to 10.")
CHUNK = 2_000


def fresh_database(admin_url: str, name: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    return admin_url.replace("/herd?", f"/{name}?", 1)


async def fill(app: App, batch: str, n: int) -> None:
    for start in range(0, n, CHUNK):
        docs = {f"{batch}-{i:06d}.txt": f"Paper {batch} {i}.\nIts results, number {i}.\n"
                for i in range(start, min(n, start + CHUNK))}  # fmt: skip
        await submit_texts(app, SPEC, docs, batch=batch)


async def read(app: App, batch: str, calls: int) -> dict[str, Any]:
    """(median, p95) ms of ``calls`` status reads, the jobs one fetched, its counts."""
    fetched: list[int] = []
    get_jobs = app.broker.get_jobs

    async def counted(ids: Any) -> Any:
        fetched.extend(ids)
        return await get_jobs(ids)

    app.broker.get_jobs = counted  # type: ignore[method-assign]
    try:
        status = await evaluate.batch_status(app, batch)  # warm up
        fetched.clear()
        await evaluate.batch_status(app, batch)
        jobs = len(fetched)
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            await evaluate.batch_status(app, batch)
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        app.broker.get_jobs = get_jobs  # type: ignore[method-assign]
    return {
        "median": statistics.median(times),
        "p95": sorted(times)[max(0, math.ceil(0.95 * calls) - 1)],
        "jobs": jobs,
        "documents": status.documents,
        "queued": status.queued,
    }


async def run(url: str, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    app = App(database_url=url)
    async with app:
        t0 = time.perf_counter()
        await fill(app, "big", args.documents)
        await fill(app, "small", args.small)
        print(f"submitted {args.documents + args.small} documents in"
              f" {time.perf_counter() - t0:.1f} s", file=sys.stderr)  # fmt: skip
        return {b: await read(app, b, args.calls) for b in ("big", "small")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--broker", choices=("postgres", "redis"), default="postgres")
    parser.add_argument("--redis-url", default=None, help="the Redis broker's (--broker redis)")
    parser.add_argument("--url", default=None, help="a PostgreSQL database to use (emptied)")
    parser.add_argument("--summary", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()
    if min(args.documents, args.small, args.calls) < 1:
        parser.error("--documents, --small and --calls take positive numbers")
    if args.broker == "redis" and not args.redis_url:
        parser.error("--broker redis needs --redis-url (its data is flushed)")
    os.environ.setdefault("OPENAI_API_KEY", "sk-bench-not-called")
    os.environ["HERD_BROKER"] = args.broker
    if args.redis_url:
        os.environ["HERD_REDIS_URL"] = args.redis_url
    home = None
    if args.url is None:
        home = Path(tempfile.mkdtemp(prefix="herd-bench-status-"))
        url = fresh_database(embedded_server(home).acquire(), "bench_status")
    else:
        url = args.url
    try:
        if args.redis_url:
            import redis  # the bench's own flush of its Redis

            redis.Redis.from_url(args.redis_url).flushall()
        found = asyncio.run(run(url, args))
    finally:
        if home is not None:
            embedded_server(home).release()
            shutil.rmtree(home, ignore_errors=True)
    where = Path(herd.__file__).resolve().parent.parent
    print(f"herd from {where}, broker {args.broker}, load {os.getloadavg()[0]:.1f}")
    for batch, r in found.items():
        print(f"{batch:>5}: {r['documents']:>6} documents, {r['queued']:>6} queued;"
              f" status read median {r['median']:8.1f} ms, p95 {r['p95']:8.1f} ms,"
              f" {r['jobs']:>6} jobs fetched")  # fmt: skip
    if args.summary:
        big, small = found["big"], found["small"]
        _summary.write(
            args.summary,
            "status_read",
            peer=f"{args.small} documents waiting",
            rows=[
                _summary.row(
                    f"status read, {args.documents} waiting (median)",
                    big["median"],
                    small["median"],
                    "ms",
                    "lower",
                ),
            ],  # fmt: skip
            notes=[
                f"jobs fetched per read: {big['jobs']} ({args.documents} waiting),"
                f" {small['jobs']} ({args.small} waiting)"
            ],  # fmt: skip
        )


if __name__ == "__main__":
    main()
