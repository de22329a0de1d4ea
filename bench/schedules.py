"""Periodic jobs under SIGKILL: a fleet of ``herd worker`` processes fires a schedule
of every second while workers are killed at random; every tick must make exactly one
job (none twice, none lost: the schedule back-fills with catch_up).

``--workers`` (4) workers run this module's app on the embedded PostgreSQL, then on
Redis (Redis Stack, started here). A killer SIGKILLs a random worker every 0.5 to
``--kill-every`` × 2 seconds (one time in ten: every worker at once) and starts
replacements, until the schedule has made ``--ticks`` (1,000) runs. Then the jobs are
read back: ticks made twice, ticks missing between the first and the last, and how
late each job was enqueued after its tick (a tick missed while no worker ran is
enqueued by the next one up, late).

    python bench/schedules.py [--ticks 1000] [--workers 4] [--kill-every 5]
        [--systems postgres,redis] [--summary PATH]

A run takes about ``--ticks`` seconds per system. Run from the repository root.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import _summary  # noqa: E402
from herd import App  # noqa: E402
from herd.embedded import embedded_server  # noqa: E402
from herd.queue.base import Broker  # noqa: E402
from herd.queue.postgres import PostgresBroker  # noqa: E402
from herd.queue.redis import RedisBroker  # noqa: E402
from herd.testing.fleet import Fleet, herd_worker, worker_env  # noqa: E402
from herd.testing.servers.redis_stack import RedisStackServer  # noqa: E402

QUEUE = "bench-schedules"

# The app the workers run (``herd worker bench.schedules:app``).
app = App()


@app.periodic(every=1, policy="catch_up", catch_up=1000, queue=QUEUE,
              name=os.environ.get("BENCH_SCHEDULE", "bench-tick"))  # fmt: skip
@app.task(name="bench.schedules.tick", queue=QUEUE)
def tick(payload: dict[str, Any]) -> None:
    return None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


async def run_system(
    backend: str, url: str, args: argparse.Namespace, logs: Path
) -> dict[str, Any]:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    store = {"database_url": url} if backend == "postgres" else {"redis_url": url}
    env = worker_env(broker=backend, pythonpath=[REPO], BENCH_SCHEDULE=name, **store)
    argv = herd_worker("bench.schedules:app", "--queue", QUEUE, "--concurrency", "2",
                       "--poll-interval", "0.5", "--grace", "5")  # fmt: skip
    broker: Broker = PostgresBroker(url) if backend == "postgres" else RedisBroker(url)
    await broker.open()
    kills = all_at_once = 0

    async def runs() -> int:
        found = await broker.schedules([name])
        return found[0].runs if found else 0

    started = time.monotonic()
    try:
        with Fleet(argv, env, logs=logs / backend, cwd=REPO) as fleet:
            fleet.start(args.workers)
            while (n := await runs()) < args.ticks:
                await asyncio.sleep(random.uniform(0.5, 2 * args.kill_every))
                running = fleet.running
                if random.random() < 0.1:
                    for member in running:
                        fleet.kill(member.pid)
                    all_at_once += 1
                    kills += len(running)
                elif running:
                    fleet.kill(random.choice(running).pid)
                    kills += 1
                fleet.start(args.workers - len(fleet.running))
                print(f"  {backend}: {n}/{args.ticks} runs, {kills} kills", file=sys.stderr)
            fleet.stop()
        (state,) = await broker.schedules([name])
        jobs = [j for j in await broker.list_jobs(queue=QUEUE, limit=args.ticks * 3)
                if isinstance(j.payload, dict) and j.payload.get("schedule") == name]  # fmt: skip
    finally:
        await broker.close()
    ticks = [datetime.fromisoformat(j.payload["tick"]) for j in jobs]  # type: ignore[index]
    late = [(j.created_at - t).total_seconds() for j, t in zip(jobs, ticks, strict=True)]
    distinct = sorted(set(ticks))
    span = int((distinct[-1] - distinct[0]).total_seconds()) + 1 if distinct else 0
    expected = {distinct[0] + timedelta(seconds=i) for i in range(span)} if distinct else set()
    return {
        "backend": backend,
        "seconds": round(time.monotonic() - started, 1),
        "runs": state.runs,
        "jobs": len(jobs),
        "ticks": span,
        "twice": len(ticks) - len(distinct),
        "missing": len(expected - set(distinct)),
        "kills": kills,
        "all_killed": all_at_once,
        "late_p50": round(percentile(late, 0.5), 3),
        "late_p99": round(percentile(late, 0.99), 3),
        "late_max": round(max(late), 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ticks", type=int, default=1000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--kill-every", type=float, default=5.0, help="mean seconds between kills")
    p.add_argument("--systems", default="postgres,redis")
    p.add_argument("--quick", action="store_true", help="60 ticks a system")
    p.add_argument("--summary", type=Path, help="write the figures here (bench/_summary.py)")
    args = p.parse_args(argv)
    if args.quick:
        args.ticks = 60
    systems = args.systems.split(",")
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="herd-bench-schedules-"))
    logs = tmp / "logs"
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    pg = embedded_server(tmp / "herd-home") if "postgres" in systems else None
    rs = None
    results = []
    try:
        if pg is not None:
            results.append(asyncio.run(run_system("postgres", pg.acquire(), args, logs)))
        if "redis" in systems:
            rs = RedisStackServer(REPO / ".herd-test" / "cache", tmp / "redis", modules=())
            rs.start()
            results.append(asyncio.run(run_system("redis", rs.url, args, logs)))
    finally:
        if pg is not None:
            pg.release()
        if rs is not None:
            rs.stop()
    rows = []
    for r in results:
        print(json.dumps(r))
        rows.append(
            _summary.row(
                f"{r['backend']}: ticks run twice or missing, of {r['ticks']} (goal)",
                r["twice"] + r["missing"],
                0,
                "ticks",
                "lower",
            )
        )
    _summary.write(args.summary, "schedules", "the goal", rows,
                   [f"{args.workers} workers, a random one SIGKILLed every 0.5 to"
                    f" {2 * args.kill_every:g} s"], time.monotonic() - started)  # fmt: skip
    return 0 if all(r["twice"] == 0 and r["missing"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
