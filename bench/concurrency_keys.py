"""Concurrency keys: the claim's throughput with 1 key and with 1,000 keys, against the
same claim without keys, on PostgreSQL (embedded) and Redis (Redis Stack), one run.

Each variant enqueues N no-op jobs (none with a key; all with one key whose limit is
above what the claimers hold, so the limit never binds and the cost of the key is
what is measured; round-robin over 1,000 keys with a limit of 2 each, which the
claimers never reach either), then ``--claimers`` claimers of one process claim up to
``--per-claim`` jobs at a time and complete them at once, until the queue is empty.
Printed: claimed and completed jobs/s per variant and its ratio to the run without
keys (goal of issue 33: at least 0.8). The "peer" column of the summary is herd's own
claim without keys.

    python bench/concurrency_keys.py [--jobs 20000] [--claimers 10] [--per-claim 5]
        [--rounds 3] [--backends postgres,redis] [--quick] [--summary PATH]

``--quick``: 3,000 jobs, one round (a smoke run). Run from the repository root.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _summary
from queue_throughput import fresh_database

from herd.embedded import embedded_server
from herd.queue.base import Broker, Completion, NewJob
from herd.queue.postgres import PostgresBroker
from herd.queue.redis import RedisBroker

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "bench-keys"
# name -> (key of job i or None, the keys' limit)
VARIANTS: dict[str, tuple[Callable[[int], str | None], int]] = {
    "no key": (lambda i: None, 1),
    "1 key": (lambda i: "tenant:only", 1_000_000),
    "1,000 keys": (lambda i: f"tenant:{i % 1000}", 2),
}


async def drain(broker: Broker, jobs: int, claimers: int, per_claim: int) -> float:
    """Claimed and completed jobs per second, from the first claim to the last completion."""
    done = 0

    async def claimer(n: int) -> None:
        nonlocal done
        while done < jobs:
            leases = await broker.claim([QUEUE], f"bench-{n}", per_claim)
            if not leases:
                # Nothing for this claimer now (another holds the key's row, or the last
                # jobs are out): a short poll, as a worker's wait.
                await asyncio.sleep(0.002)
                continue
            ok = await broker.complete_if_leased([Completion(lease, None) for lease in leases])
            done += sum(ok)

    t0 = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(claimer(n) for n in range(claimers))), 600)
    return jobs / (time.perf_counter() - t0)


async def one(make: Callable[[], Broker], variant: str, args: argparse.Namespace) -> float:
    key_of, limit = VARIANTS[variant]
    broker = make()
    await broker.open()
    try:
        batch = [
            NewJob(
                "noop", {"i": i}, queue=QUEUE, concurrency_key=key_of(i), max_running_per_key=limit
            )
            for i in range(args.jobs)
        ]
        for start in range(0, len(batch), 1000):
            await broker.enqueue(batch[start : start + 1000])
        return await drain(broker, args.jobs, args.claimers, args.per_claim)
    finally:
        await broker.close()


def measure(
    backend: str, fresh: Callable[[str], Callable[[], Broker]], args: argparse.Namespace
) -> dict[str, float]:
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for variant in VARIANTS:  # interleaved: a slow spell of the machine hits all alike
            rates[variant].append(
                asyncio.run(one(fresh(f"{r}_{len(rates[variant])}"), variant, args))
            )
        line = " | ".join(f"{v} {rates[v][-1]:,.0f}/s" for v in VARIANTS)
        print(f"{backend} round {r + 1}: {line}", file=sys.stderr)
    return {v: statistics.median(x) for v, x in rates.items()}


def run_postgres(args: argparse.Namespace) -> dict[str, float]:
    home = Path(tempfile.mkdtemp(prefix="herd-bench-keys-"))
    server = embedded_server(home)
    admin = server.acquire()
    try:
        return measure(
            "postgres",
            lambda tag: (
                lambda: PostgresBroker(
                    fresh_database(admin, f"bench_keys_{tag}"), pool_size=args.claimers + 2
                )
            ),
            args,
        )
    finally:
        server.release()
        shutil.rmtree(home, ignore_errors=True)


def run_redis(args: argparse.Namespace) -> dict[str, float]:
    sys.path.insert(0, str(ROOT))
    import redis

    from herd.testing.servers.redis_stack import RedisStackServer

    data = Path(tempfile.mkdtemp(prefix="herd-bench-keys-redis-"))
    server = RedisStackServer(ROOT / ".herd-test" / "cache", data)
    server.start()

    def fresh(tag: str) -> Callable[[], Broker]:
        with redis.Redis.from_url(server.url) as conn:
            conn.flushdb()
        return lambda: RedisBroker(server.url, pool_size=args.claimers + 2)

    try:
        return measure("redis", fresh, args)
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--claimers", type=int, default=10)
    parser.add_argument("--per-claim", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", default="postgres,redis", help="postgres, redis")
    parser.add_argument("--quick", action="store_true", help="3,000 jobs, one round")
    parser.add_argument("--summary", type=Path, help="write the figures as JSON")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.rounds = 3_000, 1
    runs = {"postgres": run_postgres, "redis": run_redis}
    backends = [b for b in args.backends.split(",") if b]
    if unknown := set(backends) - set(runs):
        parser.error(f"--backends: postgres, redis, not {sorted(unknown)}")
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    print(
        f"claim throughput: {args.jobs:,} no-op jobs, {args.claimers} claimers of up to"
        f" {args.per_claim}, {args.rounds} round(s), medians; ratio to no key (goal 0.8)"
    )
    for backend in backends:
        med = runs[backend](args)
        base = med["no key"]
        print(f"{backend:10}" + "".join(f"{v:>12}" for v in VARIANTS))
        print(f"{'jobs/s':10}" + "".join(f"{med[v]:>12,.0f}" for v in VARIANTS))
        print(f"{'ratio':10}" + "".join(f"{med[v] / base:>12.2f}" for v in VARIANTS))
        for v in list(VARIANTS)[1:]:
            rows.append(
                _summary.row(f"{backend}: claim, {v} (vs no key)", med[v], base, "jobs/s", "higher")
            )
    _summary.write(
        args.summary,
        "concurrency_keys",
        "herd's own claim without keys",
        rows,
        notes=[
            f"{args.jobs:,} jobs, {args.claimers} claimers of up to {args.per_claim},"
            f" {args.rounds} round(s); 1 key: a limit that never binds; 1,000 keys: 2 each",
            "goal (issue 33): a ratio of at least 0.8",
        ],
        seconds=time.perf_counter() - t0,
    )


if __name__ == "__main__":
    main()
