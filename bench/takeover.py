"""How soon a SIGKILLed worker's job runs again: herd (PostgreSQL, Redis) against Celery.

herd: ``--workers`` (3) ``herd worker`` processes (concurrency 1, the default poll
interval) on the embedded PostgreSQL, then on Redis (Redis Stack, started here), with
``--lease`` (30 s) leases. Each of ``--kills`` (20) rounds enqueues one job whose first
run never ends, SIGKILLs the worker running it, starts a replacement, and times from
the kill (the process reaped) to the job's second start (the task reports
``time.time()``; it ends at once) and to its completion. A frozen worker would keep the
job until the lease expired; a killed one loses its liveness mark with its connection,
and the next claim takes the job over.

Celery (the peer: Redis transport, ``task_acks_late``, ``task_reject_on_worker_lost``,
prefetch 1, ``visibility_timeout`` = the lease, kombu's restore sweep every second):
``--peer-kills`` (5) solo workers each take one such task and are SIGKILLed together,
replacements started at once; each task is timed from the kill to its second start.
Kombu puts an unacknowledged message back once it is older than the visibility
timeout, alive worker or not, so its redelivery waits out the timeout (and a task
running longer than it is delivered twice, which herd's renewed leases never do).

    pip install -e ".[bench-celery]" && python bench/takeover.py [--kills 20]
        [--lease 30] [--workers 3] [--peer-kills 5] [--systems postgres,redis,celery]
        [--quick] [--summary PATH]

About 2.5 minutes on 2 cores (Celery's share is one visibility timeout). Run from the
repository root; everything listens on 127.0.0.1 and is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from herd import App, JobContext  # noqa: E402
from herd.testing.fleet import Fleet, herd_worker, wait_until, worker_env  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _summary  # noqa: E402

QUEUE = "bench-takeover"
TASK = "bench.takeover.hold"

# The app the herd workers run (``herd worker bench.takeover:app``).
app = App()


@app.task(name=TASK, queue=QUEUE, max_stalls=100)
async def hold(payload: dict[str, Any], ctx: JobContext) -> dict[str, float]:
    if ctx.lease.stalls == 0:
        await asyncio.sleep(3600)  # until SIGKILL
    return {"started": time.time()}


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q of them at or below it."""
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]


# --------------------------------------------------------------------------- herd


def run_herd(backend: str, url: str, args: argparse.Namespace, logs: Path) -> list[list[float]]:
    """[[kill -> second start, kill -> done], ...] over ``args.kills`` rounds."""
    store = {"database_url": url} if backend == "postgres" else {"redis_url": url}
    env = worker_env(broker=backend, pythonpath=[REPO], **store)
    env.pop("HERD_DATABASE_DIRECT_URL", None)
    argv = herd_worker("bench.takeover:app", "--queue", QUEUE, "--concurrency", "1",
                       "--poll-interval", str(args.poll_interval))  # fmt: skip
    marks = _mark_counter(backend, url)
    with Fleet(argv, env, logs=logs, name=f"herd-{backend}", cwd=REPO) as fleet:
        fleet.start(args.workers)
        return asyncio.run(_rounds(backend, url, args, fleet, marks))


def _mark_counter(backend: str, url: str) -> Callable[[], int]:
    """How many worker liveness marks the store shows (workers ready to take over)."""
    if backend == "postgres":
        import psycopg

        def count() -> int:
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1"
                    " AND granted"
                ).fetchone()
            return int(row[0]) if row else 0

        return count
    import redis

    client = redis.Redis.from_url(url, decode_responses=True)
    return lambda: sum(c["name"].startswith("herd-live:") for c in client.client_list())


async def _rounds(
    backend: str,
    url: str,
    args: argparse.Namespace,
    fleet: Fleet,
    marks: Callable[[], int],
) -> list[list[float]]:
    from herd.queue.base import JobStatus, NewJob
    from herd.queue.postgres import PostgresBroker
    from herd.queue.redis import RedisBroker

    broker = PostgresBroker(url) if backend == "postgres" else RedisBroker(url)
    await broker.open()
    out: list[list[float]] = []
    try:
        for n in range(args.kills):
            await wait_until(
                lambda: marks() >= args.workers,
                60,
                what=f"{args.workers} herd workers",
                interval=0.01,
            )
            (r,) = await broker.enqueue(
                [NewJob(TASK, {"n": n}, queue=QUEUE, lease_seconds=args.lease, max_stalls=100)]
            )

            async def taken(job_id: int = r.job_id) -> Any:
                job = await broker.get_job(job_id)
                held = job and job.status == JobStatus.PROCESSING and job.lease_owner
                return job if held else None

            async def succeeded(job_id: int = r.job_id) -> Any:
                job = await broker.get_job(job_id)
                return job if job and job.status == JobStatus.SUCCEEDED else None

            job = await wait_until(taken, 30, what="a herd worker to take the job", interval=0.01)
            pid = int(job.lease_owner.split(":")[-2])
            fleet.kill(pid)
            killed = time.time()
            fleet.replace(pid)  # its slot: the next round waits for a full fleet again
            job = await wait_until(
                succeeded, args.lease + 30, what=f"job {r.job_id} to run again", interval=0.005
            )
            done = time.time()
            assert isinstance(job.result, dict)
            out.append([float(job.result["started"]) - killed, done - killed])
            print(
                f"  herd/{backend} kill {n + 1}/{args.kills}: ran again after"
                f" {out[-1][0]:.2f}s, done after {out[-1][1]:.2f}s",
                file=sys.stderr,
            )
    finally:
        await broker.close()
    return out


# --------------------------------------------------------------------------- Celery


def run_celery(url: str, args: argparse.Namespace, logs: Path) -> list[float]:
    """Seconds from the kill to each task's second start."""
    import redis

    from bench import _celery_takeover as ct

    env = worker_env(
        pythonpath=[REPO],
        BENCH_CELERY_BROKER=url,
        BENCH_VISIBILITY=str(args.lease),
        BENCH_RESTORE_EVERY="1",
    )

    def argv(n: int) -> list[str]:
        return [sys.executable, "-m", "celery", "-A", "bench._celery_takeover", "worker",
                "--pool", "solo", "--concurrency", "1", "--queues", ct.QUEUE,
                "--hostname", f"w{n}@bench", "--loglevel", "WARNING",
                "--without-gossip", "--without-mingle", "--without-heartbeat"]  # fmt: skip

    r = redis.Redis.from_url(url, decode_responses=True)
    capp = ct.make_app(url, args.lease, 1.0)
    try:
        with Fleet(argv, env, logs=logs, name="celery", cwd=REPO) as fleet:
            victims = fleet.start(args.peer_kills)
            keys = [f"k{n}" for n in range(args.peer_kills)]
            for key in keys:
                capp.send_task(ct.TASK, args=(key,), queue=ct.QUEUE)
            # Every worker runs one task (prefetch 1, solo pool): all of them are victims.
            asyncio.run(
                wait_until(
                    lambda: r.hlen(ct.STARTS) >= len(keys),
                    120,
                    what="every Celery task to start",
                    interval=0.01,
                )
            )
            for victim in victims:
                fleet.kill(victim.pid)
            killed = time.time()
            fleet.start(args.peer_kills)
            asyncio.run(
                wait_until(
                    lambda: r.hlen(ct.RESTARTED) >= len(keys),
                    args.lease + 120,
                    what="Celery redeliveries",
                    interval=0.05,
                )
            )
            return [float(r.hget(ct.RESTARTED, k) or 0) - killed for k in keys]
    finally:
        capp.close()
        r.close()


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--kills", type=int, default=20, help="SIGKILLs per herd backend")
    p.add_argument("--lease", type=float, default=30.0, help="lease / visibility timeout, s")
    p.add_argument("--workers", type=int, default=3, help="herd worker processes")
    p.add_argument("--poll-interval", type=float, default=1.0, help="herd workers' poll, s")
    p.add_argument("--peer-kills", type=int, default=5, help="Celery workers killed at once")
    p.add_argument("--systems", default="postgres,redis,celery", help="comma-separated")
    p.add_argument("--quick", action="store_true", help="a smoke run: 5 kills, 2 for Celery")
    p.add_argument("--summary", type=Path, help="write the figures as JSON (bench/report.py)")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (logs)")
    args = p.parse_args(argv)
    if args.quick:
        args.kills, args.peer_kills = min(args.kills, 5), min(args.peer_kills, 2)
    for name in ("kills", "workers", "peer_kills"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.lease <= 0 or args.poll_interval <= 0:
        p.error("--lease and --poll-interval must be positive")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(systems) - {"postgres", "redis", "celery"}
    if unknown:
        p.error(f"--systems: unknown {sorted(unknown)} (postgres, redis, celery)")

    from herd.embedded import embedded_server
    from herd.testing.servers.redis_stack import RedisStackServer

    tmp = Path(tempfile.mkdtemp(prefix="herd-bench-takeover-"))
    logs = tmp / "logs"
    logs.mkdir()
    herd: dict[str, list[list[float]]] = {}
    celery: list[float] = []
    pg = embedded_server(tmp / "herd-home") if "postgres" in systems else None
    rs = None
    # A second signal must not leave children behind: SIGTERM ends like Ctrl-C.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        if pg is not None:
            print("herd on PostgreSQL ...", file=sys.stderr)
            herd["postgres"] = run_herd("postgres", pg.acquire(), args, logs)
        if {"redis", "celery"} & set(systems):
            rs = RedisStackServer(REPO / ".herd-test" / "cache", tmp / "redis", modules=())
            rs.start()
            import redis

            if "redis" in systems:
                print("herd on Redis ...", file=sys.stderr)
                herd["redis"] = run_herd("redis", rs.url, args, logs)
            if "celery" in systems:
                redis.Redis.from_url(rs.url).flushdb()
                print(f"Celery on Redis ({args.lease:g} s visibility timeout) ...", file=sys.stderr)
                celery = run_celery(rs.url, args, logs)
    finally:
        if pg is not None:
            pg.release()
        if rs is not None:
            rs.stop()
        if args.keep:
            print(f"logs kept in {logs}", file=sys.stderr)
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)

    print(f"\nTakeover after SIGKILL, {args.lease:g} s leases ({args.workers} herd workers,"
          f" poll {args.poll_interval:g} s):")  # fmt: skip
    peer50 = percentile(celery, 0.5) if celery else 0.0
    peer95 = percentile(celery, 0.95) if celery else 0.0
    rows = []
    for backend, samples in herd.items():
        again = [s[0] for s in samples]
        done = [s[1] for s in samples]
        p50, p95 = percentile(again, 0.5), percentile(again, 0.95)
        line = f"  herd/{backend:8} runs again p50 {p50:6.2f}s p95 {p95:6.2f}s"
        line += f" (done p95 {percentile(done, 0.95):.2f}s, max {max(again):.2f}s, n={len(again)})"
        if celery:
            line += f"  ratio to Celery p95 {p95 / peer95:.3f}"
            rows += [
                _summary.row(
                    f"runs again after SIGKILL, p50 ({backend})", p50, peer50, "s", "lower"
                ),
                _summary.row(
                    f"runs again after SIGKILL, p95 ({backend})", p95, peer95, "s", "lower"
                ),
            ]
        print(line)
    if celery:
        print(
            f"  Celery/redis   runs again p50 {peer50:6.2f}s p95 {peer95:6.2f}s (n={len(celery)})"
        )
    _summary.write(
        args.summary,
        "takeover",
        "Celery",
        rows,
        [
            f"{args.lease:g} s leases (Celery: visibility timeout), {args.workers} herd workers"
            f" polling every {args.poll_interval:g} s; {args.kills} SIGKILLs per herd backend,"
            f" {args.peer_kills} Celery workers killed at once; the peer runs on Redis"
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
