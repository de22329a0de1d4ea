"""Concurrency keys: the claim's throughput with 1,000 keys and with 1 key, each against
the same claim without keys at the same concurrency, on PostgreSQL (embedded) and Redis
(Redis Stack), one run.

Each variant enqueues N no-op jobs, then ``--claimers`` claimers of one process claim up
to ``--per-claim`` jobs at a time and complete them at once, until the queue is empty.
The pairs, each printed as its ratio (goal of issue 33: at least 0.8):

- 1,000 keys: jobs round-robin over 1,000 keys with a limit of 2 each, which the
  claimers never reach; against no key. What a key costs a claim: finding keys with
  room in turn order, and counting each claim and each end per key.
- 1 key, limit 2: every job of one key that may run 2 at once. The limit bounds the
  throughput itself (2 jobs in flight, whatever the claimers), so its pair is no key
  with 2 in flight: the same claimers, each asking only for the room left under a cap
  of 2 kept in the process, polling as a keyed claimer does when its key is full.
  What it shows: how close the store's fleet-wide bound comes to a free local one.
- 1 hot key: one key whose limit (1,000,000) is never reached, against no key. Its
  worst case: claims of one key take turns on the key's counter row (the bound needs
  them ordered), so one claim at a time, whatever the claimers. Shown, not a goal.

Before the claimers start, the database's statistics are brought up to date (ANALYZE),
as autovacuum keeps them in a running system: on tables a minute old the planner plans
blind, and for the keyed claim that is a walk of every key instead of a few.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _summary
import psycopg
from queue_throughput import fresh_database

from herd.embedded import embedded_server
from herd.queue.base import Broker, Completion, NewJob
from herd.queue.postgres import PostgresBroker
from herd.queue.redis import RedisBroker

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "bench-keys"
POLL = 0.02  # seconds a claimer that got nothing waits


@dataclass(frozen=True)
class Variant:
    key_of: Callable[[int], str | None]
    limit: int  # the keys' limit
    cap: int | None = None  # jobs in flight at most, kept by the claimers (no key)
    share: int = 1  # runs 1/share of --jobs (a capped run is slow by design)


VARIANTS: dict[str, Variant] = {
    "no key": Variant(lambda i: None, 1),
    "1,000 keys": Variant(lambda i: f"tenant:{i % 1000}", 2),
    "no key, 2 in flight": Variant(lambda i: None, 1, cap=2, share=4),
    "1 key, limit 2": Variant(lambda i: "tenant:only", 2, share=4),
    "1 hot key": Variant(lambda i: "tenant:only", 1_000_000),
}
# (variant, the one it is measured against)
PAIRS = [
    ("1,000 keys", "no key"),
    ("1 key, limit 2", "no key, 2 in flight"),
    ("1 hot key", "no key"),
]
# A store made fresh for one run: the broker's factory, and what readies it once the
# jobs are in (PostgreSQL: ANALYZE).
Fresh = tuple[Callable[[], Broker], Callable[[], None]]


async def drain(broker: Broker, jobs: int, claimers: int, per_claim: int, cap: int | None) -> float:
    """Claimed and completed jobs per second, from the first claim to the last completion.

    Each claimer is a worker: it claims again at once after its jobs end, and polls (every
    ``POLL`` seconds) after a claim that got nothing, with or without keys."""
    done = in_flight = 0

    async def claimer(n: int) -> None:
        nonlocal done, in_flight
        while done < jobs:
            # The cap's room is taken before the claim, so that claimers side by side
            # never hold more than the cap between them.
            want = per_claim if cap is None else min(per_claim, cap - in_flight)
            in_flight += want
            leases = await broker.claim([QUEUE], f"bench-{n}", want) if want > 0 else []
            in_flight -= want - len(leases)
            if not leases:
                # Its key full or held by another claim, the cap reached, or the last
                # jobs out.
                await asyncio.sleep(POLL)
                continue
            ok = await broker.complete_if_leased([Completion(lease, None) for lease in leases])
            in_flight -= len(leases)
            done += sum(ok)

    t0 = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(claimer(n) for n in range(claimers))), 600)
    return jobs / (time.perf_counter() - t0)


async def one(fresh: Fresh, variant: str, args: argparse.Namespace) -> float:
    v = VARIANTS[variant]
    make, ready = fresh
    jobs = args.jobs // v.share
    broker = make()
    await broker.open()
    try:
        batch = [
            NewJob(
                "noop",
                {"i": i},
                queue=QUEUE,
                concurrency_key=v.key_of(i),
                max_running_per_key=v.limit,
            )
            for i in range(jobs)
        ]
        for start in range(0, len(batch), 1000):
            await broker.enqueue(batch[start : start + 1000])
        ready()
        return await drain(broker, jobs, args.claimers, args.per_claim, v.cap)
    finally:
        await broker.close()


def measure(
    backend: str, fresh: Callable[[str], Fresh], args: argparse.Namespace
) -> dict[str, float]:
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for variant in VARIANTS:  # interleaved: a slow spell of the machine hits all alike
            tag = f"{r}_{len(rates[variant])}_{list(VARIANTS).index(variant)}"
            rates[variant].append(asyncio.run(one(fresh(tag), variant, args)))
        line = " | ".join(f"{v} {rates[v][-1]:,.0f}/s" for v in VARIANTS)
        print(f"{backend} round {r + 1}: {line}", file=sys.stderr)
    return {v: statistics.median(x) for v, x in rates.items()}


def run_postgres(args: argparse.Namespace) -> dict[str, float]:
    home = Path(tempfile.mkdtemp(prefix="herd-bench-keys-"))
    server = embedded_server(home)
    admin = server.acquire()

    def fresh(tag: str) -> Fresh:
        url = fresh_database(admin, f"bench_keys_{tag}")

        def analyze() -> None:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("ANALYZE")

        return lambda: PostgresBroker(url, pool_size=args.claimers + 2), analyze

    try:
        return measure("postgres", fresh, args)
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

    def fresh(tag: str) -> Fresh:
        with redis.Redis.from_url(server.url) as conn:
            conn.flushdb()
        return lambda: RedisBroker(server.url, pool_size=args.claimers + 2), lambda: None

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
        f"claim throughput: {args.jobs:,} no-op jobs ({args.jobs // 4:,} with 2 in flight),"
        f" {args.claimers} claimers of up to {args.per_claim}, {args.rounds} round(s),"
        " medians; ratio of each to its pair (goal 0.8)"
    )
    for backend in backends:
        med = runs[backend](args)
        print(f"{backend:22}{'jobs/s':>8}  {'against':22}{'jobs/s':>8}{'ratio':>7}")
        for v, against in PAIRS:
            print(
                f"{v:22}{med[v]:>8,.0f}  {against:22}{med[against]:>8,.0f}"
                f"{med[v] / med[against]:>7.2f}"
            )
            rows.append(
                _summary.row(
                    f"{backend}: claim, {v} (vs {against})",
                    med[v],
                    med[against],
                    "jobs/s",
                    "higher",
                )
            )
    _summary.write(
        args.summary,
        "concurrency_keys",
        "herd's own claim without keys, at the same concurrency",
        rows,
        notes=[
            f"{args.jobs:,} jobs ({args.jobs // 4:,} for the pair with 2 in flight),"
            f" {args.claimers} claimers of up to {args.per_claim}, {args.rounds} round(s)",
            "1,000 keys: 2 each, never reached; 1 key, limit 2: against no key with at most"
            " 2 in flight; 1 hot key: a limit never reached, claims take turns on its row",
            "goal (issue 33): a ratio of at least 0.8",
        ],
        seconds=time.perf_counter() - t0,
    )


if __name__ == "__main__":
    main()
