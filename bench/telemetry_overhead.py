"""What herd.telemetry costs a queue: herd without OpenTelemetry vs with the API only.

Each mode runs in a process of its own, on one embedded PostgreSQL, in alternating
rounds: ``off`` hides the package (``sys.modules["opentelemetry"] = None``, as if it
were not installed), ``api`` is a default install (the API, which FastAPI brings, and
no SDK: the API's no-op tracer answers), ``sdk`` sets the SDK's tracer provider with
no exporter (every span recorded, then dropped). Each enqueues N no-op jobs one
``enqueue`` call at a time (a send span each) and drains them with a worker (a
process span each, a receive span per claim). Prints jobs/s per mode, the CPU time
the process spent per job (steadier than rates on a shared machine) and the ratio of
each to ``off``, then the per-job cost of the span helpers alone (send + run).

    python bench/telemetry_overhead.py [--jobs 3000] [--rounds 3] [--modes off,api,sdk]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import psycopg

from herd.embedded import embedded_server

ROUND = textwrap.dedent(
    """
    import asyncio, json, sys, time, timeit
    mode, url, jobs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "off":
        sys.modules["opentelemetry"] = None
    elif mode == "sdk":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        trace.set_tracer_provider(TracerProvider())
    from datetime import UTC, datetime
    from herd import App, Worker, telemetry
    from herd.queue.base import Lease, NewJob

    async def main():
        app = App(database_url=url)
        app.task(name="noop")(lambda payload: None)
        async with app:
            cpu = time.process_time()
            t0 = time.perf_counter()
            for i in range(jobs):
                await app.enqueue("noop", {"i": i})
            enq = time.perf_counter() - t0
            worker = Worker(app, concurrency=10, poll_interval=0.05, stop_when_idle=True,
                            install_signal_handlers=False)
            t0 = time.perf_counter()
            stats = await worker.run()
            drain = time.perf_counter() - t0
            assert stats.succeeded == jobs, stats
            cpu_us = (time.process_time() - cpu) / jobs * 1e6
        return jobs / enq, jobs / drain, cpu_us

    enq, drain, cpu_us = asyncio.run(main())
    lease = Lease(1, 1, "noop", "default", {}, 0, 0, 3, 30.0, datetime.now(UTC), "w")
    new = [NewJob("noop", {})]

    def helpers():
        with telemetry.sending(new) as send:
            send.sent([])
        with telemetry.Run(lease, "w") as run:
            run.outcome("succeeded")

    n = 20000
    per_job_us = min(timeit.repeat(helpers, number=n, repeat=3)) / n * 1e6
    print(json.dumps({"enqueue": enq, "drain": drain, "cpu_us": cpu_us, "helpers_us": per_job_us,
                      "enabled": telemetry.enabled()}))
    """
)


def fresh_database(admin_url: str, name: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    return admin_url.replace("/herd?", f"/{name}?", 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="off,api,sdk")
    args = parser.parse_args()
    modes = args.modes.split(",")
    home = Path(tempfile.mkdtemp(prefix="herd-bench-otel-"))
    server = embedded_server(home)
    admin = server.acquire()
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    try:
        # Whichever mode ran second in a round was measured slower, by ~10% here: the
        # order turns each round (ABBA...), and a first run is discarded.
        order = [("warm-up", modes[0])] + [
            (str(r), m) for r in range(args.rounds) for m in (modes if r % 2 == 0 else modes[::-1])
        ]
        for r, mode in order:
            url = fresh_database(admin, f"bench_otel_{mode}_{r}".replace("-", "_"))
            out = subprocess.run(
                [sys.executable, "-c", ROUND, mode, url, str(args.jobs)],
                capture_output=True,
                text=True,
                check=True,
            )
            if r != "warm-up":
                runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        server.release()
        shutil.rmtree(home, ignore_errors=True)
    keys = ("enqueue", "drain", "cpu_us")
    base = {k: statistics.median(r[k] for r in runs[modes[0]]) for k in keys}
    print(f"{args.jobs} jobs, {args.rounds} rounds, medians; ratio to {modes[0]!r}")
    print(
        f"{'mode':<6}{'enqueue/s':>11}{'ratio':>7}{'drain/s':>10}{'ratio':>7}"
        f"{'CPU/job':>12}{'ratio':>7}{'helpers/job':>14}"
    )
    for mode in modes:
        enq, drain, cpu = (statistics.median(r[k] for r in runs[mode]) for k in keys)
        us = statistics.median(r["helpers_us"] for r in runs[mode])
        print(
            f"{mode:<6}{enq:>11.0f}{enq / base['enqueue']:>7.3f}"
            f"{drain:>10.0f}{drain / base['drain']:>7.3f}"
            f"{cpu:>9.0f} µs{cpu / base['cpu_us']:>7.3f}{us:>11.2f} µs"
        )


if __name__ == "__main__":
    main()
